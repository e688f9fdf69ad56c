"""`chat_template_kwargs` on `/v1/chat/completions` (vLLM's and SGLang's extension): the
variables reach the chat template, a body that is not a JSON object or that sets a variable the
server sets itself is a 400 naming the field, and the OpenAPI spec describes it. A fake engine
(no model) echoes the prompt it was given, so each test reads the rendered template."""

from __future__ import annotations

import httpx
import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine.results import Submission
from sgl_lite.backend.types import FinishReason, ReqOutput
from sgl_lite.server import create_app
from tests.conftest import build_tiny_tokenizer
from tests.e2e.server_fixture import serve

# Qwen3's switch, reduced to what the test reads: a branch on `enable_thinking`.
TEMPLATE = (
    "{% if enable_thinking is defined and enable_thinking is false %}[no-think]"
    "{% else %}[think]{% endif %}"
    "{% if persona is defined %}[persona={{ persona }}]{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class EchoEngine:
    """Engine.submit's contract; the completion is the prompt it was given, decoded."""

    def __init__(self) -> None:
        self.config = EngineConfig(served_model_name="echo", device="cpu")
        self.model_folder = "/models/echo"
        self.context_length = 4096
        self.tokenizer = build_tiny_tokenizer()
        self.tokenizer.chat_template = TEMPLATE
        self.prompts: list[str] = []

    def max_new_tokens_room(self, prompt_len: int) -> int:
        return self.context_length - prompt_len

    def submit(self, sink, input_ids=None, rid=None, **_):
        rid, ids = rid[0], input_ids[0]  # the server submits a batch of one
        text = self.tokenizer.decode(ids)
        self.prompts.append(text)
        sink(
            ReqOutput(
                rid=rid,
                text=text,
                output_ids=(1,),
                ids_start=0,
                prompt_tokens=len(ids),
                completion_tokens=1,
                cached_tokens=0,
                forced_tokens=0,
                e2e_latency=0.01,
                finish_reason=FinishReason.length_reached(1),
            )
        )
        return Submission((rid,), ((rid,),), batched=True)

    def abort(self, rid: str) -> None:
        pass


@pytest.fixture(scope="module")
def url():
    with serve(create_app(EchoEngine())) as base:
        yield base


def chat(url: str, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Best pet?"}], "max_tokens": 1, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def prompt_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_template_kwargs_reach_the_template(url):
    assert prompt_of(chat(url)).startswith("[think]<|im_start|>user\nBest pet?")
    off = prompt_of(chat(url, chat_template_kwargs={"enable_thinking": False}))
    assert off.startswith("[no-think]<|im_start|>user\nBest pet?<|im_end|>\n")
    assert off.endswith("<|im_start|>assistant\n")
    both = prompt_of(chat(url, chat_template_kwargs={"enable_thinking": True, "persona": "cat"}))
    assert both.startswith("[think][persona=cat]<|im_start|>user")
    assert prompt_of(chat(url, chat_template_kwargs=None)).startswith("[think]")
    assert prompt_of(chat(url, chat_template_kwargs={})).startswith("[think]")


@pytest.mark.parametrize("value", [["enable_thinking"], "enable_thinking=false", 1, True])
def test_template_kwargs_that_are_not_an_object_are_a_400_naming_the_field(url, value):
    response = chat(url, chat_template_kwargs=value)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("key", ["add_generation_prompt", "messages", "tools", "tokenize"])
def test_template_kwargs_may_not_set_what_the_server_sets(url, key):
    response = chat(url, chat_template_kwargs={key: False})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == f"chat_template_kwargs.{key}" and "reserved" in error["message"]
    assert prompt_of(chat(url)).startswith("[think]")  # and the server keeps serving


def test_openapi_spec_describes_chat_template_kwargs(url):
    spec = httpx.get(f"{url}/openapi.json", timeout=30).json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    field = body["content"]["application/json"]["schema"]["properties"]["chat_template_kwargs"]
    kinds = [t.get("type") for t in field.get("anyOf", [field])]
    assert "object" in kinds and "enable_thinking" in field["description"]

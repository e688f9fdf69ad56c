"""`chat_template_kwargs` on `/v1/chat/completions` (vLLM's and SGLang's extension): the
variables reach the chat template, a body that is not a JSON object or that sets a variable the
server sets itself is a 400 naming the field, and the OpenAPI spec describes it. The real
engine runs over a fake runner (no model) that records what it prefills, so each test reads
the rendered template the engine got."""

from __future__ import annotations

import httpx
import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from tests.support.fakes import FakeRunner
from tests.support.server import serve
from tests.support.tiny import build_tiny_tokenizer

# Qwen3's switch, reduced to what the test reads: a branch on `enable_thinking`.
TEMPLATE = (
    "{% if enable_thinking is defined and enable_thinking is false %}[no-think]"
    "{% else %}[think]{% endif %}"
    "{% if persona is defined %}[persona={{ persona }}]{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def served():
    """The real engine over a fake runner (no model) with TEMPLATE as its tokenizer's chat
    template, behind the app; no prefix cache, so each request's whole rendered prompt is one
    prefill segment the runner records."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    runner = FakeRunner(num_slots=4096, vocab_size=len(tokenizer))
    config = EngineConfig(device="cpu", max_total_tokens=4096, disable_radix_cache=True)
    with (
        Engine(config, runner=runner, tokenizer=tokenizer) as engine,
        serve(create_app(engine)) as base,
    ):
        yield base, runner, tokenizer


@pytest.fixture(scope="module")
def url(served):
    return served[0]


def chat(url: str, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Best pet?"}], "max_tokens": 1, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def prompt_of(served, response: httpx.Response) -> str:
    """The prompt the engine prefilled for the request just answered, decoded."""
    assert response.status_code == 200, response.text
    _, runner, tokenizer = served
    prefill = next(seg for step in reversed(runner.segments) for seg in step if seg.start == 0)
    return tokenizer.decode(prefill.token_ids)


def test_template_kwargs_reach_the_template(served):
    url = served[0]
    assert prompt_of(served, chat(url)).startswith("[think]<|im_start|>user\nBest pet?")
    off = prompt_of(served, chat(url, chat_template_kwargs={"enable_thinking": False}))
    assert off.startswith("[no-think]<|im_start|>user\nBest pet?<|im_end|>\n")
    assert off.endswith("<|im_start|>assistant\n")
    persona = {"enable_thinking": True, "persona": "cat"}
    both = prompt_of(served, chat(url, chat_template_kwargs=persona))
    assert both.startswith("[think][persona=cat]<|im_start|>user")
    assert prompt_of(served, chat(url, chat_template_kwargs=None)).startswith("[think]")
    assert prompt_of(served, chat(url, chat_template_kwargs={})).startswith("[think]")


@pytest.mark.parametrize("value", [["enable_thinking"], "enable_thinking=false", 1, True])
def test_template_kwargs_that_are_not_an_object_are_a_400_naming_the_field(url, value):
    response = chat(url, chat_template_kwargs=value)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("key", ["add_generation_prompt", "messages", "tools", "tokenize"])
def test_template_kwargs_may_not_set_what_the_server_sets(served, key):
    url = served[0]
    response = chat(url, chat_template_kwargs={key: False})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == f"chat_template_kwargs.{key}" and "reserved" in error["message"]
    assert prompt_of(served, chat(url)).startswith("[think]")  # and the server keeps serving


def test_openapi_spec_describes_chat_template_kwargs(url):
    spec = httpx.get(f"{url}/openapi.json", timeout=30).json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    field = body["content"]["application/json"]["schema"]["properties"]["chat_template_kwargs"]
    kinds = [t.get("type") for t in field.get("anyOf", [field])]
    assert "object" in kinds and "enable_thinking" in field["description"]

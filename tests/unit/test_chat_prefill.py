"""`continue_final_message` on `/v1/chat/completions` (response prefill, vLLM's and SGLang's
extension): the last assistant message is rendered open (no end of turn, no new assistant
header) and continued; the answer holds only the continuation, streamed or not, with `n` and
with a regex constraint; the checks vLLM makes are 400s. The real engine runs over a fake
runner that always predicts "x" and records what it prefills, with the tiny tokenizer's ChatML
template, so each test reads the exact prompt the engine got."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from tests.support.fakes import FakeRunner
from tests.support.server import serve
from tests.support.tiny import build_tiny_tokenizer

PREFILL = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served():
    """The engine over a runner that predicts "x" after anything, behind the app; no prefix
    cache, so each request's whole prompt is one prefill segment the runner records."""
    tokenizer = build_tiny_tokenizer()
    x = tokenizer.convert_tokens_to_ids("x")
    runner = FakeRunner(num_slots=4096, vocab_size=len(tokenizer), next_token=lambda seq: x)
    config = EngineConfig(device="cpu", max_total_tokens=4096, disable_radix_cache=True)
    with (
        Engine(config, runner=runner, tokenizer=tokenizer) as engine,
        serve(create_app(engine)) as base,
    ):
        yield base, runner, tokenizer


def chat(served, messages, **extra) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 3, "temperature": 0, **extra}
    return httpx.post(f"{served[0]}/v1/chat/completions", json=body, timeout=30)


def prefill_of(served) -> str:
    """The prompt of the request just answered, decoded with its special tokens."""
    _, runner, tokenizer = served
    prefill = next(seg for step in reversed(runner.segments) for seg in step if seg.start == 0)
    return tokenizer.decode(prefill.token_ids)


def prefilled(content: str = PREFILL) -> list[dict[str, str]]:
    return [*QUESTION, {"role": "assistant", "content": content}]


def test_the_last_message_is_left_open_and_only_the_continuation_comes_back(served):
    response = chat(served, prefilled(), continue_final_message=True)
    assert response.status_code == 200, response.text
    prompt = prefill_of(served)
    assert prompt.endswith(f"<|im_start|>assistant\n{PREFILL}")  # no <|im_end|>, no new turn
    assert prompt.count("<|im_start|>assistant") == 1
    message = response.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "xxx"}  # the prefill is not repeated
    assert response.json()["usage"]["completion_tokens"] == 3


def test_without_the_flag_an_assistant_message_is_a_closed_turn(served):
    assert chat(served, prefilled()).status_code == 200
    prompt = prefill_of(served)
    assert prompt.endswith(f"{PREFILL}<|im_end|>\n<|im_start|>assistant\n")


def test_add_generation_prompt_false_alone_renders_without_a_header(served):
    assert chat(served, QUESTION, add_generation_prompt=False).status_code == 200
    assert prefill_of(served).endswith("What is the capital of France?<|im_end|>\n")


def test_an_empty_prefill_opens_the_assistant_turn(served):
    response = chat(served, prefilled(""), continue_final_message=True)
    assert response.status_code == 200, response.text
    prompt = prefill_of(served)
    assert prompt.endswith("France?<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>assistant") == 1


def test_streamed_deltas_are_the_continuation(served):
    body = {"messages": prefilled(), "max_tokens": 3, "temperature": 0, "stream": True}
    body["continue_final_message"] = True
    with httpx.stream(
        "POST", f"{served[0]}/v1/chat/completions", json=body, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines]
    assert "".join(d.get("content") or "" for d in deltas) == "xxx"
    assert prefill_of(served).endswith(f"assistant\n{PREFILL}")


def test_n_choices_each_continue_the_prefill(served):
    response = chat(served, prefilled(), continue_final_message=True, n=2)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["message"]["content"] for c in choices] == ["xxx", "xxx"]


def test_a_regex_constrains_the_continuation_only(served):
    response = chat(
        served,
        prefilled("The code is "),
        continue_final_message=True,
        regex="[0-9]{3}",
        max_tokens=8,
    )
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert re.fullmatch("[0-9]{3}", content), content
    assert prefill_of(served).endswith("assistant\nThe code is ")


def test_a_json_schema_constrains_the_continuation(served):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response = chat(
        served,
        prefilled("Here it is:"),
        continue_final_message=True,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        max_tokens=24,
    )
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content)["a"], int), content


def test_continue_with_add_generation_prompt_is_a_400(served):
    response = chat(served, prefilled(), continue_final_message=True, add_generation_prompt=True)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "continue_final_message"
    assert "add_generation_prompt" in error["message"]


@pytest.mark.parametrize("role", ["user", "system", "tool"])
def test_continue_when_the_last_message_is_not_the_assistants_is_a_400(served, role):
    last = {"role": role, "content": "hi"} | ({"tool_call_id": "c1"} if role == "tool" else {})
    response = chat(served, [*QUESTION, last], continue_final_message=True)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages" and "assistant" in error["message"]
    assert chat(served, prefilled(), continue_final_message=True).status_code == 200


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_continue_final_message_must_be_a_boolean(served, value):
    response = chat(served, prefilled(), continue_final_message=value)  # null is no boolean
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "continue_final_message"

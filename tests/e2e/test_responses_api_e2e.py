"""`/v1/responses` on the embedded SmolLM2, driven by the official `openai` client: plain and
streamed answers agree, a json_schema format validates, forced tool calls validate, and a
`previous_response_id` turn is served from the radix cache."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.support.server import flush, url_fixture

SERVED = "smollm2"

url = url_fixture(served_model_name=SERVED)  # on the session's engine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def test_plain_response_answers_with_usage(client):
    reply = client.responses.create(
        model=SERVED,
        input="What is 2 + 2?",
        instructions="Answer in one short sentence.",
        max_output_tokens=8,
        temperature=0,
    )
    assert reply.status in ("completed", "incomplete") and reply.output_text
    assert reply.output[0].type == "message" and reply.model == SERVED
    usage = reply.usage
    assert 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert client.responses.retrieve(reply.id).output_text == reply.output_text
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_streamed_response_equals_the_plain_one(client):
    kwargs = {"model": SERVED, "input": "Name a color.", "max_output_tokens": 8, "temperature": 0}
    plain = client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    final = events[-1]
    assert final.type == f"response.{plain.status}"
    assert final.response.output_text == text
    assert final.response.usage.output_tokens == plain.usage.output_tokens


def test_json_schema_format_output_parses_and_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
        },
        "required": ["name", "color"],
        "additionalProperties": False,
    }
    reply = client.responses.create(
        model=SERVED,
        input="Invent a pet and its color, as JSON.",
        text={"format": {"type": "json_schema", "name": "pet", "schema": schema, "strict": True}},
        max_output_tokens=48,
        temperature=0,
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_call_is_a_valid_function_call(client, choice):
    reply = client.responses.create(
        model=SERVED,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=48,
        temperature=0,
    )
    [call] = reply.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_previous_response_id_turn_is_served_from_the_cache(client, url):
    flush(url)
    kwargs = {"model": SERVED, "max_output_tokens": 8, "temperature": 0}
    first = client.responses.create(input="Name a fruit.", **kwargs)
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = client.responses.create(
        input="Name another one.", previous_response_id=first.id, **kwargs
    )
    assert second.previous_response_id == first.id
    # the first prompt and its answer begin the second prompt
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_sglang_s_sampling_extensions_and_usage_names(client, url):
    # SGLang's test_openai_server sends frequency_penalty to /v1/responses and reads chat's
    # usage names; stop is honoured like chat's
    body = {"model": SERVED, "input": "Count: 1, 2, 3,", "temperature": 0, "max_output_tokens": 8}
    plain = httpx.post(f"{url}/v1/responses", json=body, timeout=120).json()
    text = plain["output"][0]["content"][0]["text"]
    usage = plain["usage"]
    assert usage["prompt_tokens"] == usage["input_tokens"] > 0
    assert usage["completion_tokens"] == usage["output_tokens"] > 0
    extras = {"frequency_penalty": 1.0, "top_k": 1, "min_p": 0.0, "repetition_penalty": 1.0}
    reply = httpx.post(f"{url}/v1/responses", json={**body, **extras}, timeout=120)
    assert reply.status_code == 200 and reply.json()["object"] == "response", reply.text
    stop = text.strip()[-1:]
    cut = httpx.post(f"{url}/v1/responses", json={**body, "stop": [stop]}, timeout=120).json()
    kept = "".join(p["text"] for item in cut["output"] for p in item.get("content", []))
    assert stop and stop not in kept and text.startswith(kept), (text, kept)
    bad = httpx.post(f"{url}/v1/responses", json={**body, "frequency_penalty": 3}, timeout=30)
    assert bad.status_code == 400 and "frequency_penalty" in bad.text

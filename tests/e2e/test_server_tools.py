"""OpenAI tool calling on /v1/chat/completions, driven by the official `openai` client: forced
calls always validate, "auto" answers text when no tool is needed, streamed tool-call deltas
concatenate to the plain answer, and bad tools or refused fields give a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.support.server import flush

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get-time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 24}},
            "required": ["zone"],
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul", "Rome", "Accra"]


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def assert_valid(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_named_tool_choice_returns_a_valid_call_for_ten_inputs(client):
    seen = set()
    for city in CITIES:
        reply = client.chat.completions.create(
            model="default",
            messages=ask(f"What will the weather be in {city} this week?"),
            tools=[WEATHER, TIME],
            tool_choice=named("get_weather"),
            max_tokens=48,
            temperature=0,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather" and choice.message.content is None
        seen.add(assert_valid(call)["city"])
    assert len(seen) > 1  # the arguments follow the prompt, they are not one canned answer


def test_required_tool_choice_picks_a_tool_and_validates(client):
    reply = client.chat.completions.create(
        model="default",
        messages=ask("What time is it in Tokyo?"),
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name in SCHEMAS
    assert_valid(call)


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (["bad"], named("f"), "tools[0].function.parameters"),
        (["bad"], "required", "tools[0].function.parameters"),
        ([WEATHER, "bad"], "required", "tools"),
    ],
)
def test_a_forced_call_the_engine_cannot_constrain_is_a_400_naming_the_tools(
    url, tools, choice, param
):
    bad = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
        },
    }
    body = {
        "messages": ask("hi"),
        "max_tokens": 4,
        "tools": [bad if t == "bad" else t for t in tools],
        "tool_choice": choice,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "'not'" in error["message"], error


def test_auto_on_a_prompt_that_needs_no_tool_answers_text(client):
    reply = client.chat.completions.create(
        model="default",
        messages=ask("Say hello to me."),
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=12,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content and "<tool_call>" not in choice.message.content
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("choice", [named("get_weather"), "required"])
def test_streamed_tool_call_deltas_concatenate_to_the_plain_call(client, choice):
    kwargs = {
        "model": "default",
        "messages": ask("What will the weather be in Lima?"),
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 48,
        "temperature": 0,
    }
    plain = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                assert entry["id"] is None  # the id and name come once, in the first delta
                entry["id"], entry["name"] = delta.id, delta.function.name
            entry["arguments"] += delta.function.arguments or ""
    pieces = sum(len(c.choices[0].delta.tool_calls or []) for c in chunks)
    assert pieces > 2  # the arguments arrive in pieces, not at the end
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in plain.message.tool_calls
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        "tool_calls"
    ]


def test_tool_results_in_the_history_render_into_the_prompt(client):
    reply = client.chat.completions.create(
        model="default",
        messages=[
            *ask("What is the weather in Oslo?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Oslo", "unit": "celsius", "days": 1}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": -3}'},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > 60  # the call and its result are in the prompt


def test_json_object_response_format_is_a_json_object(client):
    reply = client.chat.completions.create(
        model="default",
        messages=ask("Describe a cat as JSON."),
        response_format={"type": "json_object"},
        max_tokens=40,
        temperature=0,
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.lstrip().startswith("{")


@pytest.mark.parametrize("choice", ["required", named("get_weather")], ids=["required", "named"])
def test_a_forced_tool_call_beside_a_response_format_is_the_tool_call(client, choice):
    """The format is for an answer in text, which a forced call leaves out (OpenAI and vLLM
    answer so; DSPy's JSONAdapter sends both when its native tool calls are forced)."""
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {}}},
    }
    reply = client.chat.completions.create(
        model="default",
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER],
        tool_choice=choice,
        response_format=fmt,
        max_tokens=40,
        temperature=0,
    )
    choice_ = reply.choices[0]
    assert choice_.finish_reason == "tool_calls", choice_
    [call] = choice_.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def _bad_requests() -> list[tuple[dict, str]]:
    bad_schema = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 3}}},
    }
    not_object = {"type": "function", "function": {"name": "g", "parameters": {"type": "array"}}}
    return [
        ({"tools": [bad_schema]}, "tools[0].function.parameters"),
        ({"tools": [WEATHER, not_object]}, "tools[1].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": named("nope")}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "regex": "[a-z]+"},
            "regex",
        ),
        (
            {"tools": [{**WEATHER, "function": {**WEATHER["function"], "examples": []}}]},
            "tools.0.function.examples",
        ),
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
        ({"logit_bias": {"42": 500}}, "logit_bias"),
        ({"logit_bias": {"10000000": 5}}, "logit_bias"),
        ({"functions": [WEATHER["function"]]}, "functions"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"store": True}, "store"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"made_up_option": 1}, "made_up_option"),
        (
            {"messages": [{"role": "user", "content": "a", "audio": {"id": "x"}}]},
            "messages[0].audio",
        ),
    ]


def test_bad_tools_and_refused_fields_get_a_400_naming_the_field(url):
    before = flush(url)
    for extra, param in _bad_requests():
        body = {"messages": ask("hi"), "max_tokens": 2, **extra}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, (extra, response.text)
        error = response.json()["error"]
        assert error["param"] == param, (extra, error)
        assert param.split(".")[0].split("[")[0] in error["message"]
        good = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": ask("hi"), "max_tokens": 2, "temperature": 0},
            timeout=60,
        )
        assert good.status_code == 200, good.text
    after = flush(url)
    assert after["pool_free_tokens"] == before["pool_free_tokens"]


def test_no_op_identifiers_are_accepted(client):
    reply = client.chat.completions.create(
        model="default",
        messages=ask("hi"),
        max_tokens=2,
        user="someone",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
    )
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"42": 500}}, "logit_bias"),
        ({"logit_bias": {"x": 5}}, "logit_bias"),
        ({"echo2": 1}, "echo2"),
    ],
)
def test_refused_completion_fields_get_a_400_naming_them(url, extra, param):
    body = {"prompt": "Hello", "max_tokens": 2, **extra}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    ok = httpx.post(f"{url}/v1/completions", json={**body, **dict.fromkeys(extra)}, timeout=60)
    assert ok.status_code == (400 if param == "echo2" else 200), ok.text


def test_streamed_auto_answer_equals_the_plain_answer(client):
    kwargs = {
        "model": "default",
        "messages": ask("Name a fruit."),
        "tools": [WEATHER],
        "max_tokens": 12,
        "temperature": 0,
    }
    plain = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.message.content
    assert not any(c.choices[0].delta.tool_calls for c in chunks)

"""`/v1/responses` over HTTP, driven by the official `openai` client against a scripted engine.

The engine answers each request with the next scripted reply (streamed two tokens an output),
checks that the reply satisfies the constraint it was given, records the prompt ids, and counts
cached tokens as a radix cache would: the longest prefix shared with an earlier prompt and its
answer. So these tests check what the route owns (prompts, constraints, items, events, store,
errors) with the real tokenizer layer and no model.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from sgl_lite.server.openai.chat import ANY_OBJECT_SCHEMA
from tests.support.fakes import ReplyEngine
from tests.support.server import url_fixture

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
PET = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
    "required": ["name", "legs"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_tokenizer):
    return ReplyEngine(tiny_tokenizer)


url = url_fixture(max_stored_responses=3)


def answer(engine: ReplyEngine, *replies: str) -> None:
    engine.replies[:] = list(replies)


def test_plain_response_has_openai_shape_usage_and_prompt(client, engine):
    answer(engine, "Hello there, friend.")
    reply = client.responses.create(
        model="fake", input="Hi!", instructions="Be brief.", temperature=0.5, top_p=0.9
    )
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.status == "completed" and reply.model == "fake"
    assert reply.output_text == "Hello there, friend."
    [message] = reply.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = reply.usage
    assert usage.input_tokens == len(engine.requests[-1]["ids"])
    assert usage.output_tokens == len(engine.tokenizer.encode("Hello there, friend."))
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert engine.prompt() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    params = engine.requests[-1]["params"]
    assert (params["temperature"], params["top_p"]) == (0.5, 0.9)
    assert (reply.temperature, reply.top_p, reply.instructions) == (0.5, 0.9, "Be brief.")
    assert reply.text.format.type == "text" and reply.store is True


def test_max_output_tokens_cut_makes_an_incomplete_response(client, engine):
    answer(engine, *["one two three four five six seven eight nine ten"] * 2)
    reply = client.responses.create(model="fake", input="Count.", max_output_tokens=3)
    assert engine.requests[-1]["params"]["max_new_tokens"] == 3
    assert reply.status == "incomplete" and reply.usage.output_tokens == 3
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[0].status == "incomplete" and reply.max_output_tokens == 3
    events = list(
        client.responses.create(model="fake", input="Count.", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == reply.output_text


def test_stream_sends_the_typed_events_in_order(client, engine):
    answer(engine, "A streamed answer in pieces.")
    events = list(client.responses.create(model="fake", input="Stream it.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(kinds[4:-4]) > 3
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    added = events[2].item
    assert added.type == "message" and added.status == "in_progress" and added.content == []
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert {(e.item_id, e.output_index, e.content_index) for e in deltas} == {(added.id, 0, 0)}
    text = "".join(e.delta for e in deltas)
    assert text == "A streamed answer in pieces." == events[-4].text
    final = events[-1].response
    assert final.output_text == text and final.output[0].id == added.id
    assert final.usage.output_tokens > 0


def test_the_clients_stream_helper_accumulates_our_events(client, engine):
    answer(engine, "Accumulated by the client.")
    with client.responses.stream(model="fake", input="Helper.") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Accumulated by the client."


def test_input_items_render_calls_results_and_parts(client, engine):
    answer(engine, "It is sunny in Paris.")
    client.responses.create(
        model="fake",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "So?"}]},
        ],
        tools=[WEATHER],
        tool_choice="auto",
    )
    prompt = engine.prompt()
    assert '"name": "get_weather"' in prompt  # the tool is offered in the system message
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>user\nSo?<|im_end|>\n<|im_start|>assistant\n")


CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


def test_auto_tool_call_is_a_function_call_item(client, engine):
    answer(engine, f"<tool_call>\n{CALL}\n</tool_call>")
    reply = client.responses.create(model="fake", input="Oslo?", tools=[WEATHER])
    [call] = reply.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Oslo"} and call.status == "completed"
    assert reply.output_text == "" and reply.tool_choice == "auto"
    assert reply.tools[0].name == "get_weather"


def test_text_then_a_call_stream_as_two_items(client, engine):
    answer(engine, f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>")
    events = list(
        client.responses.create(model="fake", input="Oslo?", tools=[WEATHER], stream=True)
    )
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["message", "function_call"]
    assert done[0].content[0].text.strip() == "Let me check."
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Oslo"}
    [args_done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.arguments == args and args_done.output_index == 1
    assert [i.type for i in events[-1].response.output] == ["message", "function_call"]


@pytest.mark.parametrize(
    ("choice", "reply"),
    [("required", f"[{CALL}]"), ({"type": "function", "name": "get_weather"}, '{"city": "Oslo"}')],
)
def test_required_and_named_tool_choice_constrain_the_call(client, engine, choice, reply):
    answer(engine, reply, reply)
    plain = client.responses.create(
        model="fake", input="Oslo?", tools=[WEATHER], tool_choice=choice
    )
    assert "json_schema" in engine.requests[-1]["params"]  # the scripted reply matched it
    [call] = plain.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}
    events = list(
        client.responses.create(
            model="fake", input="Oslo?", tools=[WEATHER], tool_choice=choice, stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments  # arguments in pieces
    assert events[2].type == "response.output_item.added" and events[2].item.arguments == ""
    assert events[-1].response.output[0].arguments == call.arguments


def test_json_schema_and_json_object_formats_are_the_constraint(client, engine):
    answer(engine, '{"name": "Rex", "legs": 4}', '{"any": [1, 2]}')
    fmt = {"type": "json_schema", "name": "pet", "schema": PET, "strict": True}
    reply = client.responses.create(model="fake", input="A pet.", text={"format": fmt})
    assert json.loads(engine.requests[-1]["params"]["json_schema"]) == PET
    jsonschema.validate(json.loads(reply.output_text), PET)
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "pet"
    assert reply.text.format.schema_ == PET
    reply = client.responses.create(
        model="fake", input="JSON.", text={"format": {"type": "json_object"}}
    )
    assert engine.requests[-1]["params"]["json_schema"] == ANY_OBJECT_SCHEMA
    assert reply.text.format.type == "json_object"


def test_previous_response_id_continues_the_conversation_on_its_prefix(client, engine):
    answer(engine, "Paris is the capital.", "It is in France.")
    first = client.responses.create(model="fake", input="Capital?", instructions="Be brief.")
    second = client.responses.create(
        model="fake", input="Where?", instructions="Be brief.", previous_response_id=first.id
    )
    before = engine.tokenizer.decode(engine.requests[-2]["ids"])
    assert engine.prompt().startswith(before + "Paris is the capital.<|im_end|>")
    assert engine.prompt().endswith("<|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n")
    # the first prompt and answer are the second prompt's prefix, so the cache serves them
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert second.previous_response_id == first.id
    answer(engine, "Yes.")
    client.responses.create(model="fake", input="Sure?", previous_response_id=second.id)
    assert "Be brief." not in engine.prompt()  # instructions are not carried over
    assert "It is in France." in engine.prompt()  # but the whole chain of turns is


def test_function_call_outputs_continue_a_tool_call_response(client, engine):
    answer(engine, f"[{CALL}]", "Cold in Oslo.")
    asked = client.responses.create(
        model="fake", input="Oslo?", tools=[WEATHER], tool_choice="required"
    )
    [call] = asked.output
    reply = client.responses.create(
        model="fake",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"}],
        tools=[WEATHER],
    )
    assert reply.output_text == "Cold in Oslo."
    prompt = engine.prompt()
    assert prompt.index('<tool_call>\n{"name": "get_weather"') < prompt.index("-3 C")


def test_a_forced_tool_call_beside_a_text_format_is_the_tool_call(client, engine):
    """As on the chat route (and OpenAI's): the format is for text answers, which a forced call
    leaves out; the constraint sent is the tool call's, not the format's."""
    answer(engine, f"[{CALL}]")
    reply = client.responses.create(
        model="fake",
        input="Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        text={"format": {"type": "json_object"}},
    )
    [call] = reply.output
    assert call.type == "function_call" and call.name == "get_weather"
    sent = json.loads(engine.requests[-1]["params"]["json_schema"])
    assert sent != json.loads(ANY_OBJECT_SCHEMA) and "get_weather" in json.dumps(sent)


def test_stored_responses_are_read_back_deleted_and_bounded(client, engine, url):
    answer(engine, "one", "two", "three", "four", "five", "six")
    first = client.responses.create(model="fake", input="1")
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    unstored = client.responses.create(model="fake", input="2", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(unstored.id)
    assert err.value.body["param"] == "response_id" and unstored.id in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="fake", input="x", previous_response_id=unstored.id)
    assert err.value.body["param"] == "previous_response_id"
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    # the store holds 3 here: the least recently used goes first, and a read counts as a use
    a, b = (client.responses.create(model="fake", input=str(i)) for i in range(2))
    client.responses.retrieve(a.id)
    c, d = (client.responses.create(model="fake", input=str(i)) for i in range(2))
    assert client.responses.retrieve(a.id).id == a.id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(b.id)
    assert {client.responses.retrieve(r.id).id for r in (c, d)} == {c.id, d.id}
    deleted = httpx.delete(f"{url}/v1/responses/{a.id}").json()
    assert deleted == {"id": a.id, "object": "response", "deleted": True}


def test_streamed_responses_are_stored_when_they_finish(client, engine):
    answer(engine, "Kept after streaming.")
    events = list(client.responses.create(model="fake", input="Keep.", stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == "Kept after streaming."


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"tool_choice": {"type": "web_search_preview"}, "tools": [WEATHER]}, "tool_choice"),
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"model": "gpt-4o"}, "model"),
        ({"tools": [{**WEATHER, "parameters": {"type": "array"}}]}, "tools[0].parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "x", "name": "me"}]}, "input[0].name"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"flavour": "vanilla"}, "flavour"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ],
)
def test_unsupported_or_invalid_fields_are_refused_by_name(url, fields, param):
    body = {"model": "fake", "input": "hi", **fields}
    response = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
    error = response.json()["error"]
    assert response.status_code == (404 if param == "model" else 400), error
    assert error["param"] == param, error
    assert set(error) == {"message", "type", "param", "code"}


def test_harmless_fields_are_accepted_and_metadata_echoed(client, engine):
    answer(engine, "Fine.")
    reply = client.responses.create(
        model="fake",
        input="hi",
        metadata={"trace": "abc"},
        user="someone",
        parallel_tool_calls=False,
        truncation="disabled",
        store=True,
        reasoning={"effort": None, "summary": "auto"},  # a summary of no reasoning items
        include=["reasoning.encrypted_content"],  # (as BFCL's reasoning-model entries send)
        safety_identifier="s",
        prompt_cache_key="k",
        service_tier="auto",
        tool_choice="auto",
    )
    assert reply.output_text == "Fine."
    assert reply.metadata == {"trace": "abc"} and reply.user == "someone"
    assert [item.type for item in reply.output] == ["message"]
    assert reply.parallel_tool_calls is False and reply.truncation == "disabled"


def test_get_refuses_query_parameters_it_does_not_implement(url, client, engine):
    answer(engine, "x")
    reply = client.responses.create(model="fake", input="hi")
    response = httpx.get(f"{url}/v1/responses/{reply.id}", params={"stream": "true"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream"


def test_openapi_declares_the_responses_routes(url):
    spec = httpx.get(f"{url}/openapi.json").json()
    create = spec["paths"]["/v1/responses"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert "input" in body["required"]
    items = body["properties"]["input"]["anyOf"][1]["items"]["oneOf"]
    assert [i["$ref"].split("/")[-1] for i in items] == [
        "MessageItem",
        "FunctionCallItem",
        "FunctionCallOutputItem",
    ]
    assert "text/event-stream" in create["responses"]["200"]["content"]
    stored = spec["paths"]["/v1/responses/{response_id}"]
    schema_of = {
        method: stored[method]["responses"]["200"]["content"]["application/json"]["schema"]
        for method in ("get", "delete")
    }
    assert (schema_of["get"]["title"], schema_of["delete"]["title"]) == (
        "ResponseObject",
        "DeletedResponse",
    )
    assert "output" in schema_of["get"]["required"] and "deleted" in schema_of["delete"]["required"]
    assert "404" in stored["get"]["responses"] and "requestBody" not in stored["delete"]

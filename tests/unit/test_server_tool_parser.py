"""Tool-call scanning without a model: `<tool_call>` blocks in free text, the constrained JSON
list of calls, and streaming deltas that concatenate to the final message at every split."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sgl_lite.backend.constrained import is_any_object
from sgl_lite.backend.constrained.schema.schema_normalize import normalize
from sgl_lite.backend.constrained.schema.schema_regex import schema_to_regex
from sgl_lite.server.openai.tool_parser import ToolDeltas, message, scan
from sgl_lite.server.openai.tools import (
    BOUNDED_OBJECT_SCHEMA,
    DEFAULT_TOOL_PROMPT,
    chat_prompt,
    constraint,
    is_free_form,
    plan_tools,
)
from sgl_lite.server.protocol import ApiError
from tests.support.tools import ADD, NOTE


def _regex(params: dict[str, str]) -> str:
    """The automaton's regex for the json_schema a forced call hands the engine (the text the
    engine lets through: JSON laid out as `json.dumps` writes it)."""
    assert list(params) == ["json_schema"]
    return schema_to_regex(normalize(json.loads(params["json_schema"])))


def _accepts(params: dict[str, str], text: str) -> bool:
    """Whether the engine would let `text` through: the automaton's regex, and the schema."""
    matched = re.fullmatch(_regex(params), text) is not None
    valid = jsonschema.validators.validator_for({})(json.loads(params["json_schema"])).is_valid(
        json.loads(text)
    )
    assert matched == valid, (text, matched, valid)
    return matched


def auto(parallel: bool = True):
    return plan_tools([ADD, NOTE], "auto", parallel)


def test_auto_scan_splits_content_and_valid_calls():
    text = (
        "Let me add.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "note-it", "arguments": {"x": [1]}}</tool_call>'
    )
    result = scan(auto(), text, final=True)
    assert result.content == "Let me add.\n\n"
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        ("add", {"a": 1, "b": 2}),
        ("note-it", {"x": [1]}),
    ]
    assert message(result)["content"] == "Let me add.\n\n"


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "nope", "arguments": {}}',  # not a tool
        '{"name": "add", "arguments": {"a": "one", "b": 2}}',  # arguments do not validate
        '{"name": "add", "arguments": {"a": 1',  # not JSON
    ],
)
def test_auto_scan_keeps_a_bad_block_as_text(block):
    text = f"Hi <tool_call>{block}</tool_call>"
    result = scan(auto(), text, final=True)
    assert result.calls == [] and result.content == text


def test_auto_scan_accepts_an_unclosed_final_block_and_string_arguments():
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 4, \\"b\\": 5}"}'
    [call] = scan(auto(), text, final=True).calls
    assert json.loads(call.arguments) == {"a": 4, "b": 5}
    assert message(scan(auto(), text, final=True))["content"] is None


def test_parallel_tool_calls_false_keeps_only_the_first_call():
    block = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    result = scan(auto(parallel=False), block + block, final=True)
    assert len(result.calls) == 1 and result.content == block


def test_required_scan_reads_the_constrained_list():
    plan = plan_tools([ADD, NOTE], "required", True)
    text = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "note-it", "arguments": {}}]'
    result = scan(plan, text, final=True)
    assert [(c.name, c.arguments, c.done) for c in result.calls] == [
        ("add", '{"a": 1, "b": 2}', True),
        ("note-it", "{}", True),
    ]
    params = constraint(plan).params
    assert _accepts(params, text)
    assert not _accepts(params, "[]")
    assert not _accepts(params, '[{"name": "nope", "arguments": {}}]')
    assert not _accepts(params, '[{"name": "add", "arguments": {"a": 1}}]')


def test_required_constraint_without_parallel_calls_allows_one_call():
    plan = plan_tools([ADD, NOTE], "required", False)
    params = constraint(plan).params
    assert _accepts(params, '[{"name": "note-it", "arguments": {"k": "v"}}]')
    assert not _accepts(
        params, '[{"name": "note-it", "arguments": {}}, {"name": "note-it", "arguments": {}}]'
    )


def test_required_constraint_is_one_json_schema_naming_the_tools_field():
    one = constraint(plan_tools([ADD], "required", True))
    assert one.field == "tools[0].function.parameters"
    schema = json.loads(one.params["json_schema"])
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    [call] = schema["items"]["anyOf"]
    assert call["properties"] == {
        "name": {"const": "add"},
        "arguments": ADD["function"]["parameters"],
    }
    assert call["required"] == ["name", "arguments"] and call["additionalProperties"] is False
    assert constraint(plan_tools([ADD, NOTE], "required", True)).field == "tools"
    assert constraint(plan_tools([ADD], "none", True)) == ({}, None)


def test_named_free_form_parameters_are_an_any_object_schema_not_a_regex():
    plan = plan_tools([NOTE], {"type": "function", "function": {"name": "note-it"}}, True)
    params = constraint(plan).params
    assert list(params) == ["json_schema"]
    assert is_any_object(json.loads(params["json_schema"]))


def test_named_parameters_are_the_json_schema_as_given():
    plan = plan_tools([NOTE, ADD], {"type": "function", "function": {"name": "add"}}, True)
    named = constraint(plan)
    assert json.loads(named.params["json_schema"]) == ADD["function"]["parameters"]
    assert named.field == "tools[1].function.parameters"
    assert _accepts(named.params, '{"a": 1, "b": 2}')


def test_free_form_parameters_inside_a_required_list_are_bounded_three_deep():
    plan = plan_tools([NOTE], "required", True)
    params = constraint(plan).params
    [call] = json.loads(params["json_schema"])["items"]["anyOf"]
    assert call["properties"]["arguments"] == BOUNDED_OBJECT_SCHEMA
    assert _accepts(params, '[{"name": "note-it", "arguments": {"a": {"b": [1, null]}}}]')
    assert not _accepts(params, '[{"name": "note-it", "arguments": {"a": {"b": {"c": 1}}}}]')


def test_free_form_is_only_the_unconstrained_object():
    assert is_free_form({"type": "object"}) and is_free_form({})
    assert is_free_form({"type": "object", "title": "T", "properties": {}})
    assert not is_free_form({"type": "object", "additionalProperties": False})
    assert not is_free_form({"type": "object", "properties": {"a": {}}})
    assert not is_free_form({"type": "object", "required": ["a"]})


def test_any_object_is_only_the_unconstrained_object():
    assert is_any_object({"type": "object"})
    assert is_any_object({"type": "object", "title": "T", "properties": {}})
    assert not is_any_object({"type": "object", "additionalProperties": False})
    assert not is_any_object({"type": "object", "properties": {"a": {}}})
    assert not is_any_object({"type": "object", "required": ["a"]})
    assert not is_any_object({"type": "array"}) and not is_any_object({})


def test_no_parameters_in_a_required_list_are_the_empty_object():
    empty = {"type": "function", "function": {"name": "e"}}
    params = constraint(plan_tools([empty], "required", True)).params
    assert _accepts(params, '[{"name": "e", "arguments": {}}]')
    assert not _accepts(params, '[{"name": "e", "arguments": {"x": 1}}]')


def test_local_refs_of_embedded_parameters_point_where_they_now_are():
    parameters = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"P": {"type": "integer"}},
        "properties": {"p": {"$ref": "#/$defs/P"}, "const": {"const": {"$ref": "#/x"}}},
        "required": ["p"],
        "additionalProperties": False,
    }
    tool = {"type": "function", "function": {"name": "r", "parameters": parameters}}
    params = constraint(plan_tools([ADD, tool], "required", True)).params
    arguments = json.loads(params["json_schema"])["items"]["anyOf"][1]["properties"]["arguments"]
    assert "$schema" not in arguments
    assert arguments["properties"]["p"] == {"$ref": "#/items/anyOf/1/properties/arguments/$defs/P"}
    assert arguments["properties"]["const"] == {"const": {"$ref": "#/x"}}  # data, not a $ref
    assert _accepts(params, '[{"name": "r", "arguments": {"p": 3}}]')
    assert not _accepts(params, '[{"name": "r", "arguments": {"p": "x"}}]')


def test_an_object_schema_with_other_keywords_goes_to_the_engine():
    schema = {"type": "object", "anyOf": [{"required": ["a"]}]}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    plan = plan_tools([tool], {"type": "function", "function": {"name": "f"}}, True)
    assert constraint(plan).params == {"json_schema": json.dumps(schema)}
    [call] = json.loads(constraint(plan_tools([tool], "required", True)).params["json_schema"])[
        "items"
    ]["anyOf"]
    assert call["properties"]["arguments"] == schema


TEXTS = {
    "auto": (
        auto(),
        'Sure: <tool_call>{"name": "add", "arguments": {"a": 10, "b": -2}}</tool_call> '
        'and <tool_call>{"name": "note-it", "arguments": {"t": "x}"}}</tool_call> done',
    ),
    "required": (
        plan_tools([ADD, NOTE], "required", True),
        '[{"name": "add", "arguments": {"a": 1, "b": 22}}, {"name": "note-it", "arguments": '
        '{"s": "a]}\\"b"}}]',
    ),
    "named": (
        plan_tools([ADD], {"type": "function", "function": {"name": "add"}}, True),
        '{"a": 3, "b": 4}',
    ),
}


@pytest.mark.parametrize("kind", sorted(TEXTS))
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_deltas_at_any_split_concatenate_to_the_final_message(kind, cuts):
    plan, text = TEXTS[kind]
    deltas, content, calls = ToolDeltas(), "", {}
    for cut in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        final = cut == len(text)
        delta = deltas.delta(scan(plan, text[:cut], final), final)
        content += delta.get("content", "")
        for d in delta.get("tool_calls", []):
            entry = calls.setdefault(d["index"], ["", ""])
            entry[0] += d["function"].get("name", "")
            entry[1] += d["function"]["arguments"]
    final_message = message(scan(plan, text, True))
    assert content == (final_message["content"] or "")
    assert [tuple(v) for v in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in final_message["tool_calls"]
    ]


def test_bad_plans_name_the_field():
    with pytest.raises(ApiError) as err:
        plan_tools([ADD], {"type": "function", "function": {"name": "sub"}}, True)
    assert err.value.param == "tool_choice"
    bad = {"type": "function", "function": {"name": "x", "parameters": {"type": 7}}}
    with pytest.raises(ApiError) as err:
        plan_tools([bad], "auto", True)
    assert err.value.param == "tools[0].function.parameters"


class _NoToolsTemplate:
    chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"[{m['role']}] {m['content']}\n" for m in messages)


def test_default_prompt_puts_tools_in_the_system_message_and_calls_as_text():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}],
        },
        {"role": "tool", "content": "3"},
    ]
    text = chat_prompt(_NoToolsTemplate(), messages, auto())
    assert text.startswith("[system] Be brief.\n\n" + DEFAULT_TOOL_PROMPT.split("{tools}")[0])
    assert json.dumps(ADD) in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in text
    assert "[user] <tool_response>\n3\n</tool_response>" in text
    none = chat_prompt(_NoToolsTemplate(), messages[:2], plan_tools([ADD], "none", True))
    assert "<tools>" not in none

"""Any JSON object, any depth: OpenAI's `response_format: {"type": "json_object"}` and a tool
with free-form `parameters` are built as a recursive grammar (llguidance), whatever the engine's
grammar backend, not as the automaton's bounded regex; what comes back parses to a dict."""

from __future__ import annotations

import json

import pytest

from sgl_lite.backend.constrained import GrammarCompiler
from sgl_lite.server.openai.chat import ANY_OBJECT_SCHEMA
from tests.support.smollm import smollm2_tokenizer

DEEP = '{"a": {"b": {"c": {"d": {"e": {"f": [1, {"g": null}]}}}}}}'  # objects 7 deep
FREE = {"type": "function", "function": {"name": "save", "parameters": {"type": "object"}}}


def depth(value) -> int:
    """How deep objects and arrays nest in a JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@pytest.mark.parametrize("backend", ["outlines", "auto"])
def test_any_object_schema_is_a_recursive_grammar_on_every_backend(backend):
    compiler = GrammarCompiler(smollm2_tokenizer(), backend=backend)
    grammar = compiler.compile("json_schema", ANY_OBJECT_SCHEMA)
    assert grammar.backend == "llguidance"
    tokenizer = compiler.tokenizer
    guide = grammar.new_guide(constraint=("json_schema", ANY_OBJECT_SCHEMA))
    for token in tokenizer.encode(DEEP, add_special_tokens=False):
        assert guide.allowed_mask()[token], "a token of the 7-deep object was masked"
        guide.advance(token)
    assert guide.is_accepting() and guide.validate(DEEP) is None
    # not an object at the top: the first token of an array is masked
    fresh = grammar.new_guide(constraint=("json_schema", ANY_OBJECT_SCHEMA))
    assert not fresh.allowed_mask()[tokenizer.encode("[", add_special_tokens=False)[0]]


def test_a_deeply_nested_answer_is_allowed_through_the_engine(engine):
    # Few-shot lines nested 6 deep: the model continues the pattern, which the old regex
    # (objects at most three deep) could not produce.
    shots = "".join(
        f'{{"a": {{"b": {{"c": {{"d": {{"e": {{"f": {i}}}}}}}}}}}}}\n' for i in range(1, 4)
    )
    out = engine.generate(
        shots,
        {"json_schema": ANY_OBJECT_SCHEMA, "max_new_tokens": 60, "temperature": 0},
    )
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    assert out["meta_info"]["constraint_violation"] is None
    assert depth(json.loads(out["text"])) >= 5, out["text"]


def test_json_object_outputs_always_parse(client):
    # NOTE: llguidance gives no budget guarantee (see constrained/matchers/): a
    # sampled answer may run into max_tokens, and then says so (finish_reason "length", as
    # OpenAI's JSON mode does); every answer that finishes parses to a dict.
    finished = 0
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Describe a house as a nested JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=160,
        temperature=0.8,
        seed=0,
        n=4,
    )
    for choice in reply.choices:
        assert choice.finish_reason in ("stop", "length"), choice
        if choice.finish_reason == "stop":
            finished += 1
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert choice.message.content.startswith("{")
    assert finished >= 2


def test_a_tight_budget_closes_any_object_instead_of_cutting_it(engine):
    # llguidance's closer (closer.py) replaces the token after which no object could close
    out = engine.generate(
        "A JSON object with a long list of numbers:",
        {"json_schema": ANY_OBJECT_SCHEMA, "max_new_tokens": 6, "temperature": 0},
    )
    meta = out["meta_info"]
    assert meta["completion_tokens"] <= 6 and meta["finish_reason"]["type"] == "stop"
    assert meta["constraint_violation"] is None and meta["budget_closed"] is True
    assert isinstance(json.loads(out["text"]), dict)


def test_free_form_tool_arguments_always_parse_as_an_object(client):
    finished = 0
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Save my address: 1 Main St, Springfield."}],
        tools=[FREE],
        tool_choice={"type": "function", "function": {"name": "save"}},
        max_tokens=160,
        temperature=0.8,
        seed=0,
        n=4,
    )
    for choice in reply.choices:
        assert choice.finish_reason in ("tool_calls", "length"), choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "save"
        if choice.finish_reason == "tool_calls":
            finished += 1
            assert isinstance(json.loads(call.function.arguments), dict)
    assert finished >= 2

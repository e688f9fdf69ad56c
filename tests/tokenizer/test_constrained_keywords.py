"""Keywords the automaton cannot enforce exactly, on the automaton: `uniqueItems` and an
overlapping `oneOf` are served by a sound restriction (said in the notes), and a `oneOf` no
restriction fits is refused naming keyword and path (under `auto` too, where llguidance refuses
it as well); `patternProperties` is llguidance's under `auto` (exact there). The final
validation still judges every output against the schema as submitted."""

from __future__ import annotations

import json
import re

import pytest

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError, check_output
from tests.support.smollm import smollm2_tokenizer


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=60.0)


def test_unique_items_is_served_as_at_most_one_item(compiler: GrammarCompiler) -> None:
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}
    assert compiler.plan("json_schema", schema)[0] == "outlines"
    [note] = compiler.notes("json_schema", schema)
    assert "uniqueItems" in note and "at most one item" in note
    assert compiler.compile("json_schema", schema).new_guide(max_new_tokens=16)
    # post-validation is the last word: a repeated item is a violation whatever wrote it
    assert check_output("json_schema", schema, json.dumps(["a", "a"])) is not None


def test_overlapping_one_of_keeps_its_disjoint_branches(compiler: GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {
            "v": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "object", "properties": {"a": {"type": "integer"}}},
                    {"type": "object", "properties": {"b": {"type": "integer"}}},
                ]
            }
        },
        "required": ["v"],
    }
    regex = compiler.validate("json_schema", schema)
    [note] = compiler.notes("json_schema", schema)
    assert "oneOf at /properties/v" in note and "branches 1, 2" in note
    assert compiler.compile("json_schema", schema).backend == "outlines"
    assert re.fullmatch(regex, json.dumps({"v": "x"}))
    assert not re.fullmatch(regex, json.dumps({"v": {"a": 1, "b": "x"}}))  # valid, not written


def test_pattern_properties_go_to_llguidance(auto: GrammarCompiler) -> None:
    schema = {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}}
    assert auto.plan("json_schema", schema)[0] == "llguidance"
    assert auto.compile("json_schema", schema).backend == "llguidance"


@pytest.mark.parametrize("backend", ["outlines", "auto"])
def test_one_of_without_a_sound_restriction_is_refused_by_name(
    backend: str, compiler: GrammarCompiler, auto: GrammarCompiler
) -> None:
    schema = {"properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}
    with pytest.raises(GrammarError, match=r"'oneOf' at /properties/n"):
        (compiler if backend == "outlines" else auto).validate("json_schema", schema)

"""An unknown `format` is an annotation (JSON Schema): served with the format ignored, on every
backend, and the request's meta info says so in `constraint_notes`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sgl_lite.backend.constrained import GrammarCompiler, check_output
from sgl_lite.backend.constrained.schema.schema_normalize import normalize
from sgl_lite.backend.scheduler.output_processor import _constraint_meta
from sgl_lite.backend.types import FinishReason
from tests.support.smollm import smollm2_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"when": {"type": "string", "format": "datetime"}, "mail": {"format": "email"}},
    "required": ["when"],
}


def test_normalize_drops_only_unknown_formats_and_notes_each() -> None:
    notes: list[str] = []
    out = normalize(SCHEMA, notes)
    assert "format" not in out["properties"]["when"]
    assert out["properties"]["mail"]["format"] == "email"  # a defined format stays
    assert len(notes) == 1 and "'datetime'" in notes[0] and "/properties/when" in notes[0]
    assert SCHEMA["properties"]["when"]["format"] == "datetime"  # the input is untouched


@pytest.mark.parametrize("backend", ["auto", "outlines", "llguidance", "xgrammar"])
def test_unknown_format_is_served_with_a_note(backend: str) -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend=backend, timeout_s=60.0)
    schema = {"type": "string", "format": "datetime"}
    grammar = compiler.compile("json_schema", schema)
    assert grammar.new_guide(max_new_tokens=16).allowed_mask().any()
    [note] = compiler.notes("json_schema", schema)
    assert "datetime" in note and "not enforced" in note
    assert compiler.notes("json_schema", {"type": "string"}) == ()
    assert check_output("json_schema", schema, json.dumps("not a date")) is None  # annotation


def test_meta_info_carries_the_notes() -> None:
    class Guide:
        def meta_info(self, text: str) -> dict:
            return {"budget_closed": False, "constraint_violation": None}

    req = SimpleNamespace(
        guide=Guide(), finish_reason=FinishReason(type="stop"), constraint_notes=("a note",)
    )
    meta = _constraint_meta(req, SimpleNamespace(text="x"))  # type: ignore[arg-type]
    assert meta == {
        "budget_closed": False,
        "constraint_violation": None,
        "constraint_notes": ["a note"],
    }


def test_overlapping_pattern_properties_are_served_by_llguidance_with_a_note() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=60.0)
    schema = {
        "type": "object",
        "patternProperties": {".*": {"type": "integer"}, "^id": {"minimum": 0}},
        "additionalProperties": False,
    }
    assert compiler.plan("json_schema", schema)[0] == "llguidance"
    [note] = compiler.notes("json_schema", schema)
    assert note.startswith("patternProperties at /:") and "subset" in note
    guide = compiler.compile("json_schema", schema).new_guide(max_new_tokens=32)
    assert guide.allowed_mask().any()
    assert check_output("json_schema", schema, '{"id": 3}') is None

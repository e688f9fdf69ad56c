"""schema_keywords: keywords read from schema positions, never from property names or data;
closed_objects and normalize use it where they tested substrings of the serialised schema."""

from __future__ import annotations

from typing import Any

from sgl_lite.backend.constrained.matchers.llguidance_backend import closed_objects
from sgl_lite.backend.constrained.schema.keywords import schema_keywords

NOT_A_KEYWORD = {
    "type": "object",
    "properties": {"not": {"enum": ["oneOf", {"if": 1}]}, "allOf": {"const": "unevaluated"}},
}


def test_names_and_data_are_not_keywords() -> None:
    assert schema_keywords(NOT_A_KEYWORD) == {"type", "properties", "enum", "const"}


def test_keywords_in_every_kind_of_sub_schema_count() -> None:
    schema: dict[str, Any] = {
        "anyOf": [{"not": {"type": "null"}}],
        "items": {"if": {"minimum": 1}, "then": {"maximum": 2}},
        "$defs": {"a": {"oneOf": [True, False]}},
        "components": {"schemas": {"b": {"unevaluatedProperties": False}}},  # a $ref target
        "dependencies": {"x": ["y"], "z": {"maxContains": 1}},
    }
    used = schema_keywords(schema)
    for keyword in ("not", "if", "then", "oneOf", "unevaluatedProperties", "maxContains"):
        assert keyword in used, keyword
    assert schema_keywords(True) == frozenset()


def test_a_property_named_like_a_keyword_no_longer_leaves_the_object_open() -> None:
    closed = closed_objects(NOT_A_KEYWORD)
    assert closed["additionalProperties"] is False
    assert closed_objects({"properties": {"a": {}}, "oneOf": [{}]}) == {
        "properties": {"a": {}},
        "oneOf": [{}],
    }

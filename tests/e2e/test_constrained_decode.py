"""Model-free decode loops: whatever random logits say, the guided output matches its grammar."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from sgl_lite.backend.constrained import dtype_to_regex
from sgl_lite.backend.constrained.jump_forward import forced_bytes
from tests.e2e.test_constrained_support import decode_without_model, shared_compiler

W3_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "price": {"type": "number"},
        "category": {"type": "string", "enum": ["electronics", "books", "toys", "food"]},
    },
    "required": ["name", "price", "category"],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}
SCHEMAS = {
    "w3": W3_SCHEMA,
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["id", "tags"],
            }
        },
        "required": ["user"],
    },
    "array_of_numbers": {
        "type": "array",
        "items": {"type": "number"},
        "minItems": 1,
        "maxItems": 4,
    },
    "mixed_enum": {"enum": ["red", 1, None, True]},
    "optional_fields": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "string"}},
        "required": ["a"],
    },
    "ref": {
        "$defs": {"point": POINT},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "any_of": {
        "anyOf": [
            {"type": "integer"},
            {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
        ]
    },
    "numbers": {
        "type": "object",
        "properties": {"i": {"type": "integer"}, "f": {"type": "number"}},
        "required": ["i", "f"],
    },
    "bool_null": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "nothing": {"type": "null"}},
        "required": ["ok", "nothing"],
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": r"[A-Z]{3}-\d{2}"}},
        "required": ["code"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "qty": {"type": "integer"}},
            "required": ["kind", "qty"],
        },
        "maxItems": 3,
    },
    "const": {"type": "object", "properties": {"v": {"const": "1.0"}}, "required": ["v"]},
}
REGEXES = {
    "int": dtype_to_regex(int),
    "float": dtype_to_regex(float),
    "bool": dtype_to_regex(bool),
    "str": dtype_to_regex(str),
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "email": r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)",
    "date": r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "ipv4": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    "unicode_choice": r"(héllo|wörld|日本語) [a-c]{1,5}",
}


@pytest.mark.parametrize("jump_forward", [False, True], ids=["plain", "jump_forward"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_guided_output_validates_against_schema(name: str, jump_forward: bool) -> None:
    schema = SCHEMAS[name]
    grammar = shared_compiler().compile("json_schema", schema)
    for seed in range(3):
        out = decode_without_model(grammar, seed=seed, jump_forward=jump_forward)
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("jump_forward", [False, True], ids=["plain", "jump_forward"])
@pytest.mark.parametrize("name", list(REGEXES))
def test_guided_output_fully_matches_regex(name: str, jump_forward: bool) -> None:
    regex = REGEXES[name]
    grammar = shared_compiler().compile("regex", regex)
    for seed in range(3):
        out = decode_without_model(grammar, seed=seed, jump_forward=jump_forward)
        assert re.fullmatch(regex, out.text), out.text


def test_jump_forward_samples_fewer_steps_than_it_emits_tokens_on_w3() -> None:
    grammar = shared_compiler().compile("json_schema", W3_SCHEMA)
    out = decode_without_model(grammar, seed=0, jump_forward=True)
    assert out.sampling_steps < len(out.ids)
    plain = decode_without_model(grammar, seed=0, jump_forward=False)
    assert plain.sampling_steps == len(plain.ids) or plain.sampling_steps == len(plain.ids) + 1


def test_forced_bytes_stop_at_branches_and_cross_multibyte_characters() -> None:
    grammar = shared_compiler().compile("regex", r"日本(語|人)!")
    start = grammar.initial_state
    forced = forced_bytes(grammar, start)
    # 語 and 人 share no lead byte, so the walk stops after 日本
    assert forced == "日本".encode()
    assert forced_bytes(grammar, start) is grammar.forced[start]
    accepting = shared_compiler().compile("regex", r"ab(c)?")
    assert forced_bytes(accepting, accepting.initial_state) == b"ab"

"""schema_normalize's rewrites are exact: an instance is valid before if and only if it is valid
after, on hand-picked edge cases and on hypothesis-generated JSON values over the names and
literals the schemas use; where a rewrite does not apply the schema is left as it is."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained.schema.schema_normalize import (
    REGEX,
    URI_REFERENCE,
    keyword_path,
    normalize,
)

D7 = "http://json-schema.org/draft-07/schema#"
FORMATS = jsonschema.Draft7Validator.FORMAT_CHECKER
D2020 = "https://json-schema.org/draft/2020-12/schema"
KEYS = ("a", "b", "c", "k", "url", "type", "10", "x")
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([1.0, 0.5, "a", "b", "", "x/y", "git"]),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=6,
)
INSTANCES = st.one_of(_scalar, st.lists(_value, max_size=3), st.dictionaries(
    st.sampled_from(KEYS), _value, max_size=5))  # fmt: skip

REWRITTEN: dict[str, tuple[dict, list[Any]]] = {  # schema, hand-picked instances
    "discriminator without object type (each branch made an object)": (
        {
            "oneOf": [
                {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"properties": {"k": {"const": "b"}}, "required": ["k"]},
            ]
        },
        ["a", None, {}, {"k": "a"}, {"k": "b"}, {"k": "c"}],
    ),
    "not: {} is false (the property must be absent)": (
        {"type": "object", "properties": {"x": {"not": {}}, "a": {"not": True, "title": "t"}}},
        [{}, {"x": 1}, {"x": None}, {"a": "a"}, {"b": 1}, "a"],
    ),
    "oneOf by type": (
        {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]},
        ["a", 0, 1.0, -1, None, [], {}],
    ),
    "oneOf by discriminator": (
        {
            "type": "object",
            "oneOf": [
                {"properties": {"k": {"const": "a"}, "b": {"type": "string"}}, "required": ["k"]},
                {"properties": {"k": {"enum": ["b", 1]}}, "required": ["k"]},
            ],
        },
        [{"k": "a"}, {"k": "b"}, {"k": 1.0}, {"k": "a", "b": 2}, {}, "a"],
    ),
    "oneOf by discriminator via $ref": (
        {
            "$defs": {"A": {"properties": {"k": {"const": "a"}}, "required": ["k"]}},
            "type": "object",
            "oneOf": [
                {"$ref": "#/$defs/A"},
                {"properties": {"k": {"const": "b"}}, "required": ["k"]},
            ],
        },
        [{"k": "a"}, {"k": "b"}, {"k": "c"}, {}],
    ),
    "oneOf of required lists": (
        {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {}, 3, "a", None],
    ),
    "oneOf of three required lists": (
        {
            "type": "object",
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["c"]}],
        },
        [{"a": 1}, {"c": 1}, {"a": 1, "c": 1}, {"x": 1}, {"a": 1, "b": 1, "c": 1}],
    ),
    "oneOf of nested required lists": (
        {"oneOf": [{"required": ["a"]}, {"required": ["a", "b"]}]},
        [{"a": 1}, {"a": 1, "b": 1}, {"b": 1}],
    ),
    "draft-7 dependencies": (
        {
            "$schema": D7,
            "type": "object",
            "properties": {"url": {"type": "string"}, "type": {"type": "string"}},
            "dependencies": {"url": ["type"], "type": ["url"], "k": {"required": ["x"]}},
        },
        [{}, {"url": "a"}, {"url": "a", "type": "b"}, {"k": 1}, {"k": 1, "x": 2}, []],
    ),
    "dependentRequired and dependentSchemas": (
        {
            "$schema": D2020,
            "dependentRequired": {"a": ["b", "c"]},
            "dependentSchemas": {"x": {"properties": {"a": {"type": "integer"}}}},
        },
        [{"a": 1}, {"a": 1, "b": 1, "c": 1}, {"x": 1, "a": "s"}, {"x": 1, "a": 1, "b": 1, "c": 1}],
    ),
    "propertyNames pattern": (
        {
            "type": "object",
            "propertyNames": {"pattern": "^[1-9][0-9]*$"},
            "additionalProperties": {"type": "string"},
        },
        [{}, {"10": "a"}, {"10": 1}, {"a": "a"}, "a"],
    ),
    "vacuous array keywords": (
        {"type": "object", "properties": {"a": {"type": "string", "uniqueItems": True}}},
        [{"a": "x"}, {"a": [1, 1]}],
    ),
    "vacuous uniqueItems through oneOf": (
        {"uniqueItems": True, "oneOf": [{"type": "string"}, {"type": "integer"}]},
        ["a", 1, [1, 1]],
    ),
    "uniqueItems with one item at most": (
        {"type": "array", "maxItems": 1, "uniqueItems": True},
        [[], [1], [1, 1]],
    ),
    "propertyNames true": ({"propertyNames": True, "type": "object"}, [{}, {"a": 1}]),
    # JSONSchemaStore/lazydocker: a colour is a name or a hex code
    "oneOf by an enum the other branch refuses": (
        {"type": "string", "oneOf": [{"enum": ["red", "git"]}, {"pattern": "^#[0-9a-f]{6}$"}]},
        ["red", "#aabbcc", "x", 1],
    ),
    # Github_ultra/o62897: a short name and version, or an entry title, never both
    "oneOf by a required property the other forbids": (
        {
            "type": "object",
            "oneOf": [
                {
                    "required": ["a", "b"],
                    "properties": {"a": {}, "b": {}},
                    "additionalProperties": False,
                },
                {"required": ["k"], "properties": {"k": {}}, "additionalProperties": False},
            ],
        },
        [{"a": 1, "b": 1}, {"k": 1}, {"a": 1, "k": 1}, {}],
    ),
    # Github_ultra/o42127: a repository (two required keys) or a one-key object
    "oneOf by property counts": (
        {"type": "object", "oneOf": [{"required": ["a", "b"]}, {"maxProperties": 1}]},
        [{"a": 1, "b": 2}, {"a": 1}, {}, {"a": 1, "b": 2, "c": 3}],
    ),
    # Github_ultra/o17072: each module's `type` is pinned by an anchored literal pattern
    "oneOf by an anchored literal pattern": (
        {
            "type": "object",
            "oneOf": [
                {
                    "properties": {"type": {"type": "string", "pattern": "^git$"}},
                    "required": ["type"],
                },
                {
                    "properties": {"type": {"type": "string", "pattern": "^x/y$"}},
                    "required": ["type"],
                },
            ],
        },
        [{"type": "git"}, {"type": "x/y"}, {"type": "a"}, {}],
    ),
    # Github_ultra/o65975: definitions under a key no keyword names, reached by $refs
    "a referenced schema under an unknown key": (
        {
            "x-defs": {"c": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
            "properties": {"a": {"$ref": "#/x-defs/c"}},
        },
        [{"a": "x"}, {"a": 1}, {"a": None}],
    ),
}

# Github_trivial/o91408, Github_ultra/o65673 and o17072: `not` of property presence
REWRITTEN["not required: an object lacking one of the names"] = (
    {"properties": {"a": {"type": "integer"}}, "not": {"required": ["a", "b"]}},
    [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": None}, {"a": "x"}, "a", None, []],
)
REWRITTEN["not allOf of required lists"] = (
    {"not": {"allOf": [{"required": ["a"]}, {"required": ["b"], "title": "t"}]}},
    [{}, {"a": 1}, {"a": 1, "b": 1}, {"b": 1, "c": 1}, 1],
)
REWRITTEN["not anyOf of presences: each one absent"] = (
    {
        "type": "object",
        "not": {
            "anyOf": [{"required": ["a"]}, {"allOf": [{"required": ["b"]}, {"required": ["c"]}]}]
        },
        "anyOf": [{"required": ["k"]}, {"required": ["x"]}],
    },
    [{"k": 1}, {"k": 1, "a": 1}, {"x": 1, "b": 1}, {"x": 1, "b": 1, "c": 1}, {"b": 1, "c": 1}],
)

# JsonSchemaStore/winget: `type: integer, not: {enum: [0]}` (a non-zero exit code)
REWRITTEN["integer except listed values: the ranges between them"] = (
    {"type": "integer", "not": {"enum": [-1, 1, 2, "a", True, 0.5]}},
    [-2, -1, 0, 1, 2, 3, 1.0, 0.5, True, "a", None],
)
REWRITTEN["integer except one const, beside a bound"] = (
    {"type": "integer", "minimum": -1, "not": {"const": 0.0, "title": "zero"}},
    [-2, -1, 0, 0.0, 1, 2],
)
REWRITTEN["minProperties 1 beside a required name (always holds)"] = (
    {"type": "object", "required": ["a"], "minProperties": 1},
    [{}, {"a": 1}, {"b": 1}, "x"],
)
REWRITTEN["minProperties 1 on a closed object: one listed property present"] = (
    {"properties": {"a": {}, "b": {}}, "additionalProperties": False, "minProperties": 1},
    [{}, {"a": 1}, {"b": None}, {"c": 1}, [], "x"],
)

UNCHANGED = {
    "overlapping oneOf": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "not: {} at the root (the backends want an object there)": {"not": {}},
    "1 and 1.0 are one literal": {"oneOf": [{"const": 1}, {"const": 1.0}]},
    "required lists two names apart": {"oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
    "a $ref into the oneOf": {
        "properties": {"a": {"$ref": "#/oneOf/0"}},
        "oneOf": [{"type": "string"}, {"type": "integer"}],
    },
    "unevaluatedProperties": {
        "$schema": D2020,
        "oneOf": [{"type": "string"}, {"type": "integer"}],
        "unevaluatedProperties": False,
    },
    "propertyNames beside properties": {
        "properties": {"a": {}},
        "propertyNames": {"pattern": "^a"},
    },
    "an enum value the other branch accepts": {
        "type": "string",
        "oneOf": [{"enum": ["red", "#aabbcc"]}, {"pattern": "^#[0-9a-f]{6}$"}],
    },
    "a pattern that is not a literal": {
        "type": "object",
        "oneOf": [
            {"properties": {"type": {"type": "string", "pattern": "^g.t$"}}, "required": ["type"]},
            {"properties": {"type": {"type": "string", "pattern": "^git$"}}, "required": ["type"]},
        ],
    },
    "a forbidden name a patternProperty may take": {
        "oneOf": [
            {"required": ["a"]},
            {"additionalProperties": False, "patternProperties": {"^a": {}}},
        ]
    },
    "minProperties 2": {"properties": {"a": {}, "b": {}}, "minProperties": 2},
    "minProperties 1 beside maxProperties (Github_medium o8453)": {
        "properties": {"a": {}, "b": {}},
        "minProperties": 1,
        "maxProperties": 1,
    },
    "minProperties 1 without listed properties": {"type": "object", "minProperties": 1},
    "not of more than presence": {"not": {"required": ["a"], "type": "object"}},
    "not of an empty required list (always holds)": {"not": {"required": []}},
    "a $ref into the not": {"properties": {"a": {"$ref": "#/not"}}, "not": {"required": ["a"]}},
    "not of values beside a non-integer type": {"type": "number", "not": {"enum": [0]}},
    "not of values and more on an integer": {"type": "integer", "not": {"enum": [0], "maximum": 2}},
    "not of a const and an enum together": {"type": "integer", "not": {"const": 3, "enum": [0]}},
    "one name under two dependency keywords": {
        "dependentRequired": {"a": ["b"]},
        "dependentSchemas": {"a": {"required": ["c"]}},
    },
}


def _valid(schema: dict, instance: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


@pytest.mark.parametrize("name", list(REWRITTEN))
def test_each_rewrite_applies_and_keeps_the_hand_picked_verdicts(name: str) -> None:
    schema, instances = REWRITTEN[name]
    before = copy.deepcopy(schema)
    after = normalize(schema)
    assert schema == before  # the input is not modified
    assert after != schema
    for key in ("oneOf", "dependencies", "dependentRequired", "dependentSchemas"):
        assert f'"{key}"' not in json.dumps(after)
    assert "propertyNames" not in after and "uniqueItems" not in str(after.get("properties"))
    for instance in instances:
        assert _valid(schema, instance) == _valid(after, instance), instance


@pytest.mark.parametrize("name", list(REWRITTEN))
@settings(deadline=None)
@given(instance=INSTANCES)
def test_each_rewrite_is_exact_on_generated_instances(name: str, instance: Any) -> None:
    schema, _ = REWRITTEN[name]
    assert _valid(schema, instance) == _valid(normalize(schema), instance)


@pytest.mark.parametrize("name", [name for name in REWRITTEN if name.startswith("not ")])
def test_a_negated_presence_leaves_no_not(name: str) -> None:
    after = normalize(REWRITTEN[name][0])
    assert '"not"' not in json.dumps(after)
    branches = [*after["anyOf"], *(b for part in after.get("allOf", ()) for b in part["anyOf"])]
    absent = [b for b in branches if "properties" in b]
    assert absent and all(b["type"] == "object" for b in absent)  # a non-object fails `not`


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_a_rewrite_that_would_not_be_exact_is_not_made(name: str) -> None:
    assert normalize(UNCHANGED[name]) == UNCHANGED[name]


def test_the_exclusive_required_rewrite_forbids_the_other_names() -> None:
    after = normalize({"oneOf": [{"required": ["a"]}, {"required": ["a", "b"]}]})
    # the second branch implies the first, so it can never hold alone: only "a without b" is left
    assert after == {
        "anyOf": [
            {
                "type": "object",
                "required": ["a"],
                "properties": {"b": False},
                "additionalProperties": True,
            }
        ]
    }


def test_an_existing_any_of_is_kept_beside_the_new_one() -> None:
    schema = {
        "anyOf": [{"required": ["x"]}, {"required": ["k"]}],
        "dependentRequired": {"a": ["b"]},
    }
    after = normalize(schema)
    assert after["anyOf"] == schema["anyOf"] and len(after["allOf"]) == 1
    for instance in ({"x": 1}, {"x": 1, "a": 1}, {"x": 1, "a": 1, "b": 1}, {"a": 1, "b": 1}):
        assert _valid(schema, instance) == _valid(after, instance)


_PATH_REFERENCE = re.compile(r"/?[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*/?")


@settings(deadline=None)
@given(text=st.from_regex(f"^{URI_REFERENCE}$"))
def test_uri_reference_is_a_subset_of_rfc3986_path_references(text: str) -> None:
    # RFC 3986 relative-ref: no scheme (no ':' before the first '/'), no authority ('//')
    assert _PATH_REFERENCE.fullmatch(text.rstrip("\n")) and not text.startswith("//")
    assert ":" not in text and "%" not in text  # no lone percent escapes either


@settings(deadline=None)
@given(text=st.from_regex(f"^{REGEX}$"))
def test_regex_format_text_compiles_and_matches_itself(text: str) -> None:
    assert re.fullmatch(re.compile(text), text)
    assert jsonschema.Draft7Validator({"format": "regex"}, format_checker=FORMATS).is_valid(text)


def test_uri_reference_becomes_a_pattern_and_other_formats_stay() -> None:
    after = normalize({"properties": {"a": {"type": "string", "format": "uri-reference"}}})
    assert after["properties"]["a"] == {"type": "string", "pattern": f"^{URI_REFERENCE}$"}
    kept = {"type": "string", "format": "uri-reference", "pattern": "^a"}
    assert normalize(kept) == kept  # beside a pattern: two patterns cannot be one keyword
    assert normalize({"format": "date"}) == {"format": "date"}


def test_keyword_path_names_the_first_use_with_escapes() -> None:
    schema = {
        "properties": {"a/b": {"items": [{"type": "string"}, {"uniqueItems": True}]}},
        "$defs": {"f": {"format": "iri"}},
    }
    assert keyword_path(schema, "uniqueItems") == "/properties/a~1b/items/1"
    assert keyword_path(schema, "format", "iri".__eq__) == "/$defs/f"
    assert keyword_path(schema, "format", "date".__eq__) is None


def test_a_count_written_as_an_integral_float_is_that_integer() -> None:
    # llguidance and xgrammar refused `minLength: 2.0` (the JSON Schema Test Suite's
    # `*validation with a decimal`); 2.5 is not a count JSON Schema allows, so it stays
    after = normalize({"type": "string", "minLength": 2.0, "maxLength": 3, "x": 2.0})
    assert after == {"type": "string", "minLength": 2, "maxLength": 3, "x": 2.0}
    assert isinstance(after["minLength"], int) and isinstance(after["x"], float)
    schema = {"type": "array", "minItems": 1.0, "maxItems": 2.0, "items": {"maxLength": 1.0}}
    after = normalize(schema)
    assert type(after["maxItems"]) is int and type(after["items"]["maxLength"]) is int
    for instance in ([], ["a"], ["ab"], ["a", "b"], ["a", "b", "c"], [1.5]):
        assert _valid(schema, instance) == _valid(after, instance), instance

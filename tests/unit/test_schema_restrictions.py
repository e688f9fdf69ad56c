"""schema_normalize's sound restrictions (`uniqueItems` as `maxItems: 1`, a `oneOf` cut to
its branches disjoint from every other one): every instance the restricted schema accepts is
valid under the schema as submitted (hand-picked and hypothesis-generated values), each
restriction is described in the notes, and a schema no restriction fits is left as it is."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained.regex_check import GrammarError, pattern_body
from sgl_lite.backend.constrained.schema.schema_normalize import normalize
from sgl_lite.backend.constrained.schema.schema_pattern_properties import merged
from sgl_lite.backend.constrained.schema.schema_regex import schema_to_regex
from tests.support import examples

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["a", "b", 1.5]))
INSTANCES = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=3),
    st.dictionaries(st.sampled_from(["k", "a", "b", "n"]), _scalar, max_size=3),
)

RESTRICTED: dict[str, tuple[dict, list[Any], list[Any]]] = {  # schema, kept, cut out
    "uniqueItems": (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        [[], [1]],
        [[1, 2]],
    ),
    "oneOf with two overlapping branches": (
        {
            "oneOf": [
                {"type": "string"},
                {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}},
            ]
        },
        ["x"],
        [{"a": 1, "b": "x"}],
    ),
}


# JSONSchemaBench's Glaiveai2K/calculate_area: each branch gives `k` a literal, none requires it
# (an object without `k` matches every branch unless an absent-property `not: {}` rules one out)
UNREQUIRED_DISCRIMINATOR = {
    "oneOf": [
        {"properties": {"k": {"const": "a"}, "n": {"not": {}}}},
        {"properties": {"k": {"enum": ["b", 1]}, "a": {"type": "integer"}}},
        {"$ref": "#/$defs/c"},
    ],
    "$defs": {
        "c": {
            "type": ["object", "null"],
            "properties": {"k": {"const": None}, "a": {"type": "string"}},
        }
    },
}
RESTRICTED["oneOf with a literal property no branch requires"] = (
    UNREQUIRED_DISCRIMINATOR,
    [{"k": "a"}, {"k": "b", "a": 1}, {"k": 1.0, "n": 2}, {"k": None, "a": "x"}],
    [{"n": 1, "a": 1}],  # only branch 1 matches, but without its `k`
)
# Github_ultra/o39230 (composer): a package, or a list of them; a list matches the untyped
# package schema too, so only objects are written for the first branch and the second is cut
RESTRICTED["oneOf with an untyped branch that constrains objects only"] = (
    {"oneOf": [{"required": ["a"]}, {"type": "array"}]},
    [{"a": 1}, {"a": [1], "b": None}],
    ["x", 1],  # a non-object matches only the first branch as submitted
)
RESTRICTED["oneOf with an untyped branch that constrains objects only, beside a $ref"] = (
    {
        "oneOf": [
            {"$ref": "#/$defs/p", "required": ["a"]},
            {"type": "array", "items": {"$ref": "#/$defs/p"}},
        ],
        "$defs": {"p": {"properties": {"a": {"type": "integer"}}}},
    },
    [{"a": 1}],
    ["x", None],
)
RESTRICTED["oneOf with a literal property no branch requires, as an object"] = (
    {**UNREQUIRED_DISCRIMINATOR, "type": "object"},
    [{"k": "a", "b": None}],
    [{"n": 1, "a": 1}],
)

# Github_ultra/o17072: the discriminated branches are copies of $ref targets, rewritten as the
# targets are (here the `not` of a presence, which no backend takes as written)
RESTRICTED["oneOf with a literal property no branch requires, over $refs"] = (
    {
        "type": "object",
        "oneOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/t"}],
        "$defs": {
            "s": {"properties": {"k": {"const": "a"}}, "not": {"required": ["n"]}},
            "t": {"properties": {"k": {"const": "b"}, "n": {"type": "integer"}}},
        },
    },
    [{"k": "a", "b": 1}, {"k": "b", "n": 1}],
    [{"n": 1}],  # no `k`: only branch t matches as submitted
)
# JsonSchemaStore/embrace-config: a non-empty object of optional properties, others allowed
RESTRICTED["minProperties 1 with optional properties"] = (
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "minProperties": 1},
    [{"a": 1}, {"b": None, "n": 1}],
    [{"n": 1}],  # non-empty, but with an unlisted name only
)


def test_branches_copied_from_ref_targets_are_rewritten_too() -> None:
    schema = RESTRICTED["oneOf with a literal property no branch requires, over $refs"][0]
    out = normalize(schema)
    assert '"not"' not in json.dumps(out["anyOf"])
    assert "not" in schema["$defs"]["s"]  # the input is not modified


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name", sorted(RESTRICTED))
def test_restriction_is_a_subset_and_is_noted(name: str) -> None:
    schema, kept, cut = RESTRICTED[name]
    notes: list[str] = []
    out = normalize(schema, notes)
    assert len(notes) == 1 and notes[0].split()[0] in name, notes
    for value in kept:
        assert _valid(out, value) and _valid(schema, value), value
    for value in cut:  # valid as submitted, no longer written
        assert _valid(schema, value) and not _valid(out, value), value


@pytest.mark.parametrize("name", sorted(RESTRICTED))
@settings(max_examples=examples(150), deadline=None)
@given(value=INSTANCES)
def test_restricted_schema_accepts_only_valid_instances(name: str, value: Any) -> None:
    schema = RESTRICTED[name][0]
    if _valid(normalize(schema), value):
        assert _valid(schema, value), value


def test_no_restriction_fits_leaves_the_keyword_for_a_named_refusal() -> None:
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert normalize(overlapping) == overlapping
    many = {"type": "array", "uniqueItems": True, "minItems": 2}
    assert normalize(many) == many


def _objects() -> list[dict[str, Any]]:
    """Every object over the names of UNREQUIRED_DISCRIMINATOR and a few values (625)."""
    names, values = ("k", "a", "n", "b"), ("a", "b", 1, None)
    out: list[dict[str, Any]] = []
    for mask in range(16):
        keys = [k for i, k in enumerate(names) if mask >> i & 1]
        for picks in itertools.product(values, repeat=len(keys)):
            out.append(dict(zip(keys, picks)))
    return out


def test_the_required_discriminator_accepts_only_valid_objects_and_each_branch_still() -> None:
    after = normalize(UNREQUIRED_DISCRIMINATOR)
    assert "oneOf" not in after and all("k" in b["required"] for b in after["anyOf"])
    kept = [v for v in _objects() if _valid(after, v)]
    assert all(_valid(UNREQUIRED_DISCRIMINATOR, v) for v in kept)
    # every branch keeps values: each literal of `k` is still written
    assert {json.dumps(v["k"]) for v in kept} == {'"a"', '"b"', "1", "null"}
    assert len(kept) < sum(_valid(UNREQUIRED_DISCRIMINATOR, v) for v in _objects())


@pytest.mark.parametrize(
    "literals",
    [({"const": "a"}, {"enum": ["a", "b"]}), ({"const": 1}, {"const": 1.0})],
    ids=["shared enum value", "1 and 1.0"],
)
def test_branches_whose_literals_overlap_keep_the_named_refusal(literals: tuple) -> None:
    schema = {
        "type": "object",
        "oneOf": [{"properties": {"k": lit, "a": {"type": "integer"}}} for lit in literals],
    }
    notes: list[str] = []
    assert normalize(schema, notes) == schema and notes == []
    with pytest.raises(GrammarError, match="oneOf.*branches 0 and 1 may both match one value"):
        schema_to_regex(schema)


# JSONSchemaBench's Github_hard/o27790: `.*` beside a second pattern, which llguidance refuses
OVERLAPPING_PATTERNS = {
    "type": "object",
    "patternProperties": {"^[ab]$": {"type": "integer"}, "a": {"enum": [1, "a"]}},
    "additionalProperties": False,
}


def test_overlapping_pattern_properties_merge_into_one_alternation_and_are_noted() -> None:
    found = merged(OVERLAPPING_PATTERNS)
    assert found is not None
    out, notes = found
    [(pattern, schema)] = out["patternProperties"].items()
    assert pattern == "(?:^[ab]$)|(?:a)" and schema == {
        "allOf": [{"type": "integer"}, {"enum": [1, "a"]}]
    }
    assert len(notes) == 1 and notes[0].startswith("patternProperties at /:")
    assert _valid(out, {"a": 1}) and _valid(OVERLAPPING_PATTERNS, {"b": 2})
    assert not _valid(out, {"b": 2})  # valid as submitted: "b" matches only the first pattern
    assert len(OVERLAPPING_PATTERNS["patternProperties"]) == 2  # the input is untouched


@settings(max_examples=examples(300), deadline=None)
@given(value=INSTANCES)
def test_merged_pattern_properties_accept_only_valid_instances(value: Any) -> None:
    found = merged(OVERLAPPING_PATTERNS)
    assert found is not None
    if _valid(found[0], value):
        assert _valid(OVERLAPPING_PATTERNS, value), value


def test_pattern_properties_are_left_alone_with_one_pattern_or_a_ref_into_them() -> None:
    assert merged({"patternProperties": {".*": {"type": "integer"}}}) is None
    referenced = {
        "patternProperties": {"^a": {"type": "integer"}, "b": {}},
        "properties": {"c": {"$ref": "#/patternProperties/b"}},
    }
    assert merged(referenced) is None


# Github_ultra/o56134's `01$|^07`, and the common `^a$|^b$` (anchors per alternative)
SEARCH_PATTERNS = ["01$|^07", "^a$|^bc$", "^(a|b)$", "[|^]$", "a\\$", "a\\\\$", "^$|x", "b|^a"]


@pytest.mark.parametrize("pattern", SEARCH_PATTERNS)
@settings(max_examples=examples(200), deadline=None)
@given(text=st.text(alphabet="ab01|^$7\\x", max_size=5))
def test_a_pattern_is_written_as_strings_it_matches_whole_a_subset_of_its_search(
    pattern: str, text: str
) -> None:
    body = pattern_body(pattern)
    if re.fullmatch(body, text):
        assert re.search(pattern, text), (body, text)
    both_ends = pattern in ("^a$|^bc$", "^(a|b)$")  # every alternative anchored at both ends
    if both_ends:
        assert bool(re.fullmatch(body, text)) == bool(re.search(pattern, text)), (body, text)


def test_anchors_per_alternative_compile_into_the_automaton_regex() -> None:
    regex = schema_to_regex({"type": "string", "pattern": "^a$|^bc$"})
    assert re.fullmatch(regex, '"a"') and re.fullmatch(regex, '"bc"')
    assert not re.fullmatch(regex, '"abc"')


@pytest.mark.parametrize(
    ("internationalized", "ascii_form", "example"),
    [
        ("idn-email", "email", "a@b.co"),
        ("iri", "uri", "https://a.b/c"),
        ("idn-hostname", "hostname", "a.b"),
    ],
)
def test_internationalized_formats_are_written_as_their_ascii_forms_and_noted(
    internationalized: str, ascii_form: str, example: str
) -> None:
    notes: list[str] = []
    out = normalize({"type": "string", "format": internationalized}, notes)
    assert out == {"type": "string", "format": ascii_form}
    assert len(notes) == 1 and internationalized in notes[0] and "subset" in notes[0]
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert checker.conforms(example, ascii_form) and checker.conforms(example, internationalized)

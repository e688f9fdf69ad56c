"""Exact or refused (issue 37): a compiled JSON Schema accepts an instance only if `jsonschema`
says it is valid, or the schema is refused by name; on closed, typed compositions (where the
automaton writes no narrower subset) it accepts exactly the valid instances.

The automaton is checked without a model: its regex is matched against every key order of the
serialised instance (the automaton writes properties in one declared order). Under `auto` a
schema routed to llguidance is checked with llguidance's matcher over the tiny tokenizer.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError, check_output
from sgl_lite.backend.constrained.matchers.llguidance_backend import closed_objects, ll_tokenizer
from sgl_lite.backend.constrained.schema.schema_merge import merge_all
from sgl_lite.backend.constrained.schema.schema_normalize import normalize
from sgl_lite.backend.constrained.schema.schema_regex import schema_to_regex
from tests.support import examples
from tests.support.tiny import build_tiny_tokenizer

INT = {"type": "integer"}
CLOSED_A = {"type": "object", "properties": {"a": INT}, "additionalProperties": False}

# (schema, an invalid instance the merge used to accept, a valid instance it must still accept)
WIDENED = {
    "allOf, one part closed": (
        {"allOf": [CLOSED_A, {"properties": {"b": INT}}]},
        {"b": 2},
        {"a": 1},
    ),
    "a closed object beside an anyOf branch": (
        {**CLOSED_A, "anyOf": [{"properties": {"b": INT}}]},
        {"b": 2},
        {"a": 1},
    ),
    "a $ref to a closed object, with sibling properties": (
        {"$ref": "#/$defs/c", "properties": {"b": INT}, "$defs": {"c": CLOSED_A}},
        {"b": 1},
        {},
    ),
    "allOf of items false and prefixItems": (
        {"allOf": [{"items": False}, {"prefixItems": [INT]}]},
        [1],
        [],
    ),
    "allOf of const 1 and const true": ({"allOf": [{"const": 1}, {"const": True}]}, 1, None),
}


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


def _valid_with_formats(schema: Any, value: Any) -> bool:
    return check_output("json_schema", schema, json.dumps(value)) is None


def _texts(value: Any) -> Iterator[str]:
    """`value` as JSON in json.dumps' layout, in every order of every object's keys."""
    if isinstance(value, dict):
        options = [[json.dumps(k) + ": " + t for t in _texts(v)] for k, v in value.items()]
        for order in itertools.permutations(options):
            for picks in itertools.product(*order):
                yield "{" + ", ".join(picks) + "}"
    elif isinstance(value, list):
        for picks in itertools.product(*[list(_texts(v)) for v in value]):
            yield "[" + ", ".join(picks) + "]"
    else:
        yield json.dumps(value)


def _regex_accepts(regex: str, value: Any) -> bool:
    compiled = re.compile(regex)
    return any(compiled.fullmatch(text) for text in _texts(value))


@pytest.mark.parametrize("name", sorted(WIDENED))
def test_a_merged_schema_no_longer_accepts_what_jsonschema_rejects(name: str) -> None:
    schema, invalid, valid = WIDENED[name]
    assert not _valid(schema, invalid)
    try:
        regex = schema_to_regex(schema)
    except GrammarError:  # const 1 and const true: nothing is valid, so nothing is written
        assert valid is None
        return
    assert not _regex_accepts(regex, invalid), regex
    assert _valid(schema, valid) and _regex_accepts(regex, valid), regex


def test_the_merge_forbids_what_a_closed_part_leaves_out_and_keeps_the_rest() -> None:
    merged = merge_all([CLOSED_A, {"properties": {"b": INT}, "required": ["a"]}], "")
    assert merged == {**CLOSED_A, "required": ["a"], "properties": {"a": INT, "b": False}}
    prefix = merge_all([{"items": INT}, {"prefixItems": [{"minimum": 0}, {}], "items": False}], "")
    assert prefix == {"prefixItems": [{"allOf": [INT, {"minimum": 0}]}, INT], "items": False}


@pytest.mark.parametrize(
    ("parts", "merged"),
    [
        ([{"enum": [1, True, "x"]}, {"enum": [True, 2]}], {"enum": [True]}),
        ([{"enum": [1, "x"]}, {"enum": [1.0]}], {"enum": [1]}),  # 1.0 is 1
        ([{"const": 0}, {"const": False}], False),
        ([{"const": [1]}, {"const": [True]}], False),
        ([{"const": 1}, {"const": 1.0}], {"const": 1}),
    ],
)
def test_literals_merge_as_json_schema_compares_them(parts: list, merged: Any) -> None:
    assert merge_all(parts, "") == merged


def test_const_beside_an_enum_keeps_only_what_both_allow() -> None:
    regex = schema_to_regex({"const": 1, "enum": [True, 1.0, "a"]})
    assert re.fullmatch(regex, "1") and not re.fullmatch(regex, "true")
    with pytest.raises(GrammarError, match="admits no value"):
        schema_to_regex({"const": True, "enum": [1, 0]})


def test_dependent_schemas_of_a_closed_object_do_not_open_it() -> None:
    schema = {
        "type": "object",
        "properties": {"a": INT},
        "additionalProperties": False,
        "dependentSchemas": {"a": {"properties": {"b": INT}}},
    }
    regex = schema_to_regex(normalize(schema))  # an anyOf: `a` absent, or present and `b` too
    assert not _valid(schema, {"a": 1, "b": 2}) and not _regex_accepts(regex, {"a": 1, "b": 2})
    assert _regex_accepts(regex, {"a": 1})


def test_free_names_cannot_be_counted_so_min_properties_over_one_is_refused() -> None:
    schema = {"type": "object", "additionalProperties": INT, "minProperties": 2}
    assert not _valid(schema, json.loads('{"k": 1, "k": 2}'))  # the text has two entries
    with pytest.raises(GrammarError, match="'minProperties' at /"):
        schema_to_regex(schema)


# -- the property: generated compositions ---------------------------------------------------

NAMES = ("a", "b", "c")
# `true` and 1, `false` and 0 (equal to Python's ==, not to JSON Schema); 1 and 1.0 (equal to both)
LEAVES = [
    INT,
    {"type": "boolean"},
    {"type": "string"},
    {"type": "null"},
    {"type": "integer", "minimum": 1},
    {"const": 1},
    {"const": True},
    {"const": False},
    {"enum": [1, True, "a"]},
    {"enum": [0, False, None]},
    {"type": "integer", "enum": [True, 1]},
]
WIDE_LEAVES = [*LEAVES, True, False, {}, {"const": 1.0}, {"enum": [1.0, "a"]}, {"minimum": 1}]
SCALARS = [None, True, False, 0, 1, "a"]


def _object(leaf: st.SearchStrategy, closed: bool | None, wide: bool) -> st.SearchStrategy[dict]:
    """An object schema over NAMES: closed (additionalProperties false), open (said or not),
    or either (None); `type: object` said or, in the wide fragment, not always."""

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=2))
        schema: dict[str, Any] = {"type": "object", "properties": {n: draw(leaf) for n in names}}
        if names and draw(st.booleans()):
            schema["required"] = names[:1]
        is_closed = draw(st.booleans()) if closed is None else closed
        if is_closed:
            schema["additionalProperties"] = False
        elif draw(st.booleans()):
            schema["additionalProperties"] = draw(st.sampled_from([True, *LEAVES[:3]]))
        if wide and draw(st.booleans()):
            del schema["type"]
        return schema

    return build()


def _array(leaf: st.SearchStrategy, wide: bool) -> st.SearchStrategy[dict]:
    """An array schema: prefixItems, items (false or a leaf), and, in the exact fragment, as
    many minItems as prefix items (the automaton writes every prefix item)."""

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        prefix = draw(st.lists(leaf, max_size=2))
        schema: dict[str, Any] = {"type": "array", "prefixItems": prefix}
        if not wide or draw(st.booleans()):  # NOTE: absent, items are written as scalars
            schema["items"] = draw(st.one_of(st.just(False), leaf))
        if not wide:
            schema["minItems"] = len(prefix)
        if wide and draw(st.booleans()):
            del schema["type"]
        return schema

    return build()


def _composition(leaf: st.SearchStrategy, wide: bool, top: bool) -> st.SearchStrategy[Any]:
    """allOf, anyOf or oneOf beside a sibling object, a $ref with siblings (`top`: at the root,
    beside its $defs), of objects (one of them closed, unless `wide`), arrays or leaves."""
    closed = _object(leaf, None if wide else True, wide)
    part = _object(leaf, None, wide)
    array = _array(leaf, wide)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kinds = ["allOf", "anyOf", "oneOf", "arrays", "literals", *(["$ref"] if top else [])]
        kind = draw(st.sampled_from(kinds))
        if kind == "allOf":
            return {"allOf": draw(st.permutations([draw(closed), draw(part)]))}
        if kind in ("anyOf", "oneOf"):
            rest, branch = draw(st.permutations([closed, part]))
            return {**draw(rest), kind: draw(st.lists(branch, min_size=1, max_size=2))}
        if kind == "$ref":
            target, siblings = draw(st.permutations([closed, part]))
            return {"$ref": "#/$defs/t", **draw(siblings), "$defs": {"t": draw(target)}}
        if kind == "arrays":
            key = draw(st.sampled_from(["allOf", "anyOf"]))
            if key == "anyOf":
                return {**draw(array), "anyOf": [draw(array)]}
            return {"allOf": [draw(array), draw(array)]}
        return {draw(st.sampled_from(["allOf", "anyOf", "oneOf"])): [draw(leaf), draw(leaf)]}

    return build()


def _schemas(wide: bool) -> st.SearchStrategy[Any]:
    leaves = st.sampled_from(WIDE_LEAVES if wide else LEAVES)
    nested = st.one_of(leaves, leaves, _composition(leaves, wide, False))  # one level down
    return _composition(nested, wide, True)


def _instances(wide: bool) -> list[Any]:
    """The candidates every generated schema is checked on: scalars, objects of up to two of
    NAMES, arrays of up to two items, with objects one level down."""
    scalars = [*SCALARS, 1.0, 1.5] if wide else SCALARS
    inner = [*scalars, {}, {"a": 1}, {"a": True}, {"b": 0}, [1]]
    objects = [
        dict(zip(keys, values))
        for n in range(3)
        for keys in itertools.combinations(NAMES, n)
        for values in itertools.product(inner, repeat=n)
    ]
    arrays = [list(v) for n in range(3) for v in itertools.product(inner, repeat=n)]
    return [*scalars, *objects, *arrays]


INSTANCES = {wide: _instances(wide) for wide in (False, True)}


def _acceptor(compiler: GrammarCompiler, schema: Any) -> Callable[[Any], bool] | None:
    """What the constraint `compiler` serves for `schema` accepts (None: refused)."""
    try:
        backend, source = compiler.plan("json_schema", schema)
    except GrammarError:
        return None
    if backend == "outlines":
        return lambda value: _regex_accepts(source, value)
    from llguidance import LLMatcher

    tokenizer = compiler.tokenizer
    matcher = LLMatcher(ll_tokenizer(tokenizer), source)  # validate_tokens only reads it

    def accepts(value: Any) -> bool:
        for text in _texts(value):
            ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            if matcher.validate_tokens(ids) == len(ids):
                return True
        return False

    return accepts


def _check(compilers: dict[str, GrammarCompiler], schema: Any, wide: bool) -> None:
    try:
        regex = schema_to_regex(schema)
        acceptors = {"schema_to_regex": lambda v: _regex_accepts(regex, v)}
    except GrammarError:
        acceptors = {}
    for name, compiler in compilers.items():
        found = _acceptor(compiler, schema)
        if found is not None:
            acceptors[name] = found
    exact = {
        name: not wide and not (name in compilers and compilers[name].notes("json_schema", schema))
        for name in acceptors
    }
    for value in INSTANCES[wide]:
        valid = _valid(schema, value)
        for name, accepts in acceptors.items():
            if accepts(value):
                assert valid, f"{name} accepts an instance jsonschema rejects: {value!r}"
            elif exact[name]:
                assert not valid, f"{name} refuses a valid instance: {value!r}"


# llguidance's closing of objects (closed_objects) opened a branch that forbids `a`, and, in a
# oneOf, made one of two matching branches fail (so "exactly one" held): found by the property
LLGUIDANCE_WIDENED = {
    "a closed anyOf branch": {
        "type": "object",
        "properties": {"a": INT},
        "required": ["a"],
        "anyOf": [{"type": "object", "properties": {}, "additionalProperties": False}],
    },
    "a oneOf of two branches that both match": {
        "type": "object",
        "properties": {"a": INT},
        "required": ["a"],
        "additionalProperties": True,
        "oneOf": [
            {"type": "object", "properties": {}},
            {"type": "object", "properties": {}, "additionalProperties": True},
        ],
    },
}


def test_a_ref_beside_properties_is_not_closed_against_its_target(
    compilers: dict[str, GrammarCompiler],
) -> None:
    # 2020-12 applies a $ref and its siblings both (as allOf): closing the sibling object over
    # its own (no) names refused the target's `a` (found by the property test below in CI)
    schema = {
        "$ref": "#/$defs/t",
        "type": "object",
        "properties": {},
        "$defs": {"t": {**CLOSED_A}},
    }
    assert _valid(schema, {"a": 0})
    _check(compilers, schema, wide=False)


@pytest.mark.parametrize("name", sorted(LLGUIDANCE_WIDENED))
def test_auto_on_llguidance_does_not_accept_what_jsonschema_rejects(
    compilers: dict[str, GrammarCompiler], name: str
) -> None:
    schema = LLGUIDANCE_WIDENED[name]
    assert not _valid(schema, {"a": 0})
    accepts = _acceptor(compilers["auto"], schema)
    assert accepts is None or not accepts({"a": 0})


def test_llguidance_writes_the_date_and_time_formats_the_final_check_accepts() -> None:
    compiler = GrammarCompiler(build_tiny_tokenizer(), backend="llguidance")
    schema = {"properties": {"t": {"format": "time"}, "d": {"format": "date-time"}}}
    accepts = _acceptor(compiler, schema)
    assert accepts is not None and accepts({"t": "10:47:59Z", "d": "2020-01-01T00:00:00Z"})
    for wrong in ({"t": "10:47:60Z"}, {"d": "0000-01-01T00:00:00Z"}):  # llguidance's own allow
        assert not _valid_with_formats(schema, wrong) and not accepts(wrong), wrong


def test_an_anyof_branch_is_closed_over_the_names_of_a_closed_object() -> None:
    schema = {**CLOSED_A, "anyOf": [{"type": "object"}]}
    assert closed_objects(schema)["anyOf"] == [
        {"type": "object", "properties": {"a": True}, "additionalProperties": False}
    ]


# NOTE: no deadline, as in conftest: a loaded machine
@settings(max_examples=examples(60), deadline=None)
@given(schema=_schemas(wide=False))
def test_closed_compositions_accept_exactly_the_valid_instances(
    compilers: dict[str, GrammarCompiler], schema: Any
) -> None:
    _check(compilers, schema, wide=False)


@settings(max_examples=examples(60), deadline=None)
@given(schema=_schemas(wide=True))
def test_any_composition_accepts_only_valid_instances_or_is_refused(
    compilers: dict[str, GrammarCompiler], schema: Any
) -> None:
    _check(compilers, schema, wide=True)


# -- found by the JSON Schema Test Suite (tests/unit/test_schema_test_suite.py) --------------


@pytest.mark.timeout(60)
def test_multiple_of_is_enforced_or_refused_on_an_untyped_or_number_node() -> None:
    # an untyped multipleOf was written as any value, and `type: number, multipleOf: 1` took 1.5
    with pytest.raises(GrammarError, match="'multipleOf' at /"):
        schema_to_regex({"multipleOf": 2})
    for schema in ({"multipleOf": 1}, {"type": "number", "multipleOf": 1}):
        regex = schema_to_regex(schema)
        assert re.fullmatch(regex, "3") and not re.fullmatch(regex, "1.5"), regex


@pytest.mark.timeout(60)
def test_llguidance_refuses_an_integer_past_64_bits_as_a_grammar_error() -> None:
    compiler = GrammarCompiler(build_tiny_tokenizer(), backend="llguidance")
    schema = {"type": "integer", "minimum": -(2**64 - 1)}
    with pytest.raises(GrammarError, match="llguidance"):  # was a bare ValueError
        compiler.validate("json_schema", schema)
    with pytest.raises(GrammarError):  # submit never raises: its future fails
        compiler.submit("json_schema", {**schema, "maximum": 2**64}).result()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("schema", "invalid"),
    [
        ({"format": "date-time"}, "2020-01-01T00:00:00Z\n"),  # an untyped node: any value
        ({"pattern": "^a+$"}, "b"),
        ({"format": "idn-hostname"}, "a.b."),  # xgrammar's own idn-hostname: a trailing dot
        ({"type": "string", "format": "regex"}, "(?P<n>a)"),  # Python's syntax, not ECMA-262's
    ],
)
def test_xgrammar_enforces_string_keywords_of_an_untyped_node(schema: dict, invalid: str) -> None:
    from bench.json_schema_suite import matcher_for

    found = matcher_for(GrammarCompiler(build_tiny_tokenizer(), backend="xgrammar"), schema)
    assert not isinstance(found, str), found
    assert not found[1](json.dumps(invalid)), invalid


@pytest.mark.timeout(60)
def test_xgrammar_reads_properties_named_like_keywords_as_properties() -> None:
    from bench.json_schema_suite import matcher_for

    schema = {
        "type": "object",
        "properties": {"items": INT, "format": {"type": "string"}, "minLength": INT},
        "required": ["items"],
    }
    found = matcher_for(GrammarCompiler(build_tiny_tokenizer(), backend="xgrammar"), schema)
    assert not isinstance(found, str), found
    assert found[1]('{"items": 1, "format": "a", "minLength": 2}')
    assert not found[1]('{"items": 1, "type": "array"}')

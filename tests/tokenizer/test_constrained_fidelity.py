"""Schema fidelity, model-free: every keyword is enforced (random-logit decodes always validate,
formats included) or refused at submission with its name and path; integers and numbers are
bounded; the final check reports a mismatch instead of passing it off."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import uuid

import jsonschema
import pytest

from sgl_lite.backend.constrained import AutomatonGuide, GrammarError, check_output
from sgl_lite.common.regex import INT_MAX_DIGITS, dtype_to_regex
from tests.support.constrained import decode_without_model, shared_compiler
from tests.support.constraints import COMMENT_TREE, ENFORCED


def _check_formats(instance: dict) -> None:
    datetime.date.fromisoformat(instance["date"])
    datetime.time.fromisoformat(instance["time"].replace("Z", "+00:00"))
    datetime.datetime.fromisoformat(instance["date-time"].replace("Z", "+00:00"))
    assert re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]+", instance["email"])
    assert str(uuid.UUID(instance["uuid"])) == instance["uuid"]
    ipaddress.IPv4Address(instance["ipv4"])
    assert re.fullmatch(r"https?://[^\s/]+(/\S*)?", instance["uri"])


@pytest.mark.parametrize("name", list(ENFORCED))
def test_every_enforced_keyword_holds_on_random_decodes(name: str) -> None:
    schema = ENFORCED[name]
    grammar = shared_compiler().compile("json_schema", schema)
    for seed in range(6):
        budget = grammar.min_tokens + 6 + 5 * seed
        out = decode_without_model(
            grammar, seed=seed, jump_forward=seed % 2 == 0, max_new_tokens=budget, bias=False
        )
        instance = json.loads(out.text)
        cls = jsonschema.validators.validator_for(schema)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(instance)
        assert check_output("json_schema", schema, out.text) is None
        if name == "formats":
            _check_formats(instance)


def test_integer_range_is_compiled_into_the_pattern() -> None:
    regex = shared_compiler().validate("json_schema", ENFORCED["int_range"])
    assert [n for n in range(-10, 60) if re.fullmatch(regex, str(n))] == [1, 2, 3, 4, 5]
    unbounded = shared_compiler().validate("json_schema", {"type": "integer"})
    assert re.fullmatch(unbounded, "9" * INT_MAX_DIGITS)
    assert not re.fullmatch(unbounded, "9" * (INT_MAX_DIGITS + 1))
    assert not re.fullmatch(unbounded, "007") and not re.fullmatch(unbounded, "-0")
    assert re.fullmatch(unbounded, "-" + "9" * INT_MAX_DIGITS)


def test_numbers_have_bounded_digits_and_dtypes_follow() -> None:
    regex = shared_compiler().validate("json_schema", {"type": "number"})
    assert re.fullmatch(regex, "-12.5") and re.fullmatch(regex, "0.000001")
    assert not re.fullmatch(regex, "1" * 16) and not re.fullmatch(regex, "1.0000001")
    assert re.fullmatch(dtype_to_regex(int), "+" + "9" * 19)
    assert not re.fullmatch(dtype_to_regex(int), "9" * 20)
    assert re.fullmatch(dtype_to_regex(float), "-3.25") and re.fullmatch(
        dtype_to_regex(float), ".5"
    )
    assert not re.fullmatch(dtype_to_regex(float), "1" * 16)


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"not": {"type": "string"}}, "not", "/"),
        ({"type": "object", "properties": {"x": {"if": {}, "then": {}}}}, "if", "/properties/x"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties", "/"),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames", "/"),
        (  # one name under two dependency keywords: not rewritten (schema_normalize)
            {"type": "object", "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {}}},
            "dependentRequired",
            "/",
        ),
        ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties", "/"),
        ({"type": "array", "contains": {"const": 1}}, "contains", "/"),
        (
            {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2},
            "uniqueItems",
            "/",
        ),
        ({"type": "integer", "multipleOf": 3}, "multipleOf", "/"),
        ({"type": "number", "minimum": 0.5}, "minimum", "/"),
        ({"type": "string", "format": "duration"}, "format", "/"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "pattern", "/"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "/"),
        ({"$ref": "https://example.com/s.json"}, "$ref", "/"),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "integer"}]},
            "items",
            "/",
        ),
    ],
)
def test_every_unsupported_keyword_is_refused_with_its_name_and_path(schema, keyword, path):
    with pytest.raises(GrammarError, match=rf"keyword '{re.escape(keyword)}' at {path}"):
        shared_compiler().validate("json_schema", schema)


def test_a_ref_that_does_not_resolve_and_an_empty_schema_are_named_errors() -> None:
    with pytest.raises(GrammarError, match=r"\$ref '#/\$defs/missing' at / does not resolve"):
        shared_compiler().validate("json_schema", {"$ref": "#/$defs/missing"})
    with pytest.raises(GrammarError, match="admits no value"):
        shared_compiler().validate("json_schema", {"type": "integer", "minimum": 5, "maximum": 1})


def test_draft4_boolean_exclusive_bounds_flag_the_bound_beside_them() -> None:
    draft4 = "http://json-schema.org/draft-04/schema#"
    schema = {"$schema": draft4, "type": "integer", "minimum": 0, "exclusiveMinimum": True}
    regex = shared_compiler().validate("json_schema", {**schema, "maximum": 3})
    assert [n for n in range(-2, 6) if re.fullmatch(regex, str(n))] == [1, 2, 3]
    number = {"$schema": draft4, "type": "number", "maximum": 1, "exclusiveMaximum": True}
    regex = shared_compiler().validate(
        "json_schema", {**number, "minimum": 0, "exclusiveMinimum": False}
    )
    assert re.fullmatch(regex, "0") and re.fullmatch(regex, "0.5")
    assert not re.fullmatch(regex, "1") and not re.fullmatch(regex, "-0.5")


def test_recursion_is_bounded_and_the_deepest_level_closes() -> None:
    regex = shared_compiler().validate("json_schema", COMMENT_TREE)
    leaf = {"author": "a", "replies": []}
    nested = {"author": "a", "replies": [{"author": "b", "replies": [leaf]}]}
    too_deep = {"author": "a", "replies": [{"author": "b", "replies": [nested]}]}
    assert re.fullmatch(regex, json.dumps(nested))
    assert not re.fullmatch(regex, json.dumps(too_deep))


def test_a_mismatch_is_reported_not_passed_off() -> None:
    grammar = shared_compiler().compile("json_schema", ENFORCED["int_range"])
    guide = AutomatonGuide(grammar, constraint=("json_schema", json.dumps(ENFORCED["int_range"])))
    assert guide.meta_info("3") == {"budget_closed": False, "constraint_violation": None}
    cut = AutomatonGuide(grammar, constraint=("json_schema", ENFORCED["int_range"]))
    assert "maximum" in cut.meta_info("42")["constraint_violation"]
    assert "not valid JSON" in check_output("json_schema", {}, '{"a": "unterminated')
    assert check_output("regex", r"[0-9]{3}", "12") is not None

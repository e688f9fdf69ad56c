"""Validation errors, normalization, the shared cache, and dtype regexes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sgl_lite.backend.constrained import GrammarError
from sgl_lite.backend.constrained.compiler import GrammarCompiler, digits_to_ascii
from sgl_lite.common.regex import dtype_to_regex
from tests.support.constrained import shared_compiler
from tests.support.smollm import smollm2_tokenizer


@pytest.mark.parametrize(
    ("kind", "pattern", "message"),
    [
        ("regex", "[a-z", "invalid regex.*unterminated character set"),
        ("regex", "(a", "invalid regex.*missing \\)"),
        ("regex", r"(a)\1", "backreference"),
        ("regex", r"(?=a)a", "lookahead"),
        ("regex", r"\bword", "word boundaries"),
        ("regex", 42, "must be a string"),
        ("json_schema", '{"type": "object",', "not valid JSON"),
        ("json_schema", "[1, 2]", "must be a JSON object"),
        ("json_schema", {"type": "nonsense"}, "not a valid JSON Schema"),
        (
            "json_schema",
            {"type": "object", "required": "name"},
            "not a valid JSON Schema at required",
        ),
        ("json_schema", {"not": {"type": "string"}}, "not supported"),
        ("json_schema", {"type": "string", "format": "duration"}, "not supported.*duration"),
        ("json_schema", {"type": "string", "pattern": "(?<=x)y"}, "json_schema pattern.*lookahead"),
        ("grammar", "x", "must be 'regex', 'json_schema' or 'ebnf'"),
    ],
)
def test_invalid_patterns_raise_grammar_error_naming_the_problem(kind, pattern, message) -> None:
    compiler = shared_compiler()
    with pytest.raises(GrammarError, match=message):
        compiler.validate(kind, pattern)
    future = compiler.submit(kind, pattern)  # never raises: the error comes out of the future
    with pytest.raises(GrammarError, match=message):
        future.result(timeout=1)


def test_schema_as_string_or_dict_gives_the_same_regex_with_standard_separators() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "t": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["n", "t"],
    }
    compiler = shared_compiler()
    regex = compiler.validate("json_schema", schema)
    assert regex == compiler.validate("json_schema", json.dumps(schema))
    assert r"\d" not in regex
    # Exactly json.dumps' layout, and nothing else.
    assert re.fullmatch(regex, json.dumps({"n": 3, "t": [1, 2]}))
    assert not re.fullmatch(regex, '{"n":3,"t":[1,2]}')
    assert not re.fullmatch(regex, '{ "n": 3, "t": [1, 2] }')


def test_a_configured_whitespace_pattern_applies_everywhere() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    compiler = GrammarCompiler(smollm2_tokenizer(), whitespace_pattern=r"[ ]?")
    regex = compiler.validate("json_schema", schema)
    assert re.fullmatch(regex, '{ "n" : 3 }') and re.fullmatch(regex, '{"n":3}')


def test_digits_are_rewritten_as_ascii_inside_and_outside_classes() -> None:
    assert digits_to_ascii(r"\d+[\d.]x\\d[^\d]") == r"[0-9]+[0-9.]x\\d[^0-9]"
    assert digits_to_ascii(r"[]\d]") == r"[]0-9]"


def test_equal_patterns_share_one_compiled_grammar() -> None:
    compiler = shared_compiler()
    a = compiler.submit("regex", r"[0-9]{2}x")
    b = compiler.submit("regex", r"\d{2}x")  # normalizes to the same regex
    assert a is b
    grammar = compiler.compile("regex", r"[0-9]{2}x")
    assert grammar is a.result() and grammar.vocab_size == 49152


def test_dtype_regexes_match_sglang_with_bounded_digits() -> None:
    assert dtype_to_regex(int) == dtype_to_regex("int") == r"[-+]?[0-9]{1,19}"
    for text in ("3.25", "-.5", "+7", "12"):  # SGLang's float forms, still accepted
        assert re.fullmatch(dtype_to_regex(float), text)
    assert dtype_to_regex("bool") == r"(True|False)"
    assert dtype_to_regex(str) == r"\"[\w\d\s]*\""
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtype_to_regex(list)


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        (
            {"properties": {"tags": {"type": "array", "uniqueItems": True, "minItems": 2}}},
            "uniqueItems",
            "/properties/tags",
        ),
        (
            {"properties": {"site": {"type": "string", "format": "json-pointer"}}},
            "format",
            "/properties/site",
        ),
        (
            {"properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
            "oneOf",
            "/properties/n",
        ),
        ({"properties": {"r": {"$ref": "https://example.com/s.json"}}}, "$ref", "/properties/r"),
        ({"properties": {"o": {"not": {"type": "string"}}}}, "not", "/properties/o"),
    ],
)
def test_a_refusal_names_the_keyword_and_its_path_on_every_backend(
    backend: str, schema: dict, keyword: str, path: str
) -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend=backend)
    with pytest.raises(GrammarError, match=rf"keyword '{re.escape(keyword)}' at {path}\b"):
        compiler.validate("json_schema", {"type": "object", **schema})


def test_a_schema_is_rewritten_exactly_before_the_backends_see_it() -> None:
    # "exactly one of a and b" as a oneOf of required lists: the automaton now writes it
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    regex = shared_compiler().validate("json_schema", schema)
    assert re.fullmatch(regex, '{"a": 1}') and re.fullmatch(regex, '{"b": 2}')
    assert not re.fullmatch(regex, '{"a": 1, "b": 2}') and not re.fullmatch(regex, "{}")


def test_jsonschema_is_imported_off_the_callers_thread_by_the_compiler_not_by_the_engine():
    # jsonschema's import builds its format checkers' parser (~1 s): the engine's import must
    # not pay it, and a compiler starts it in the background before the first schema arrives
    code = (
        "import sys, time; import sgl_lite.backend.engine, sgl_lite.server.openai.tool_parser;"
        "print('jsonschema' in sys.modules);"
        "from sgl_lite.backend.constrained import GrammarCompiler;"
        "from tests.support.smollm import smollm2_tokenizer;"
        "GrammarCompiler(smollm2_tokenizer(), backend='outlines');"
        "end = time.monotonic() + 60\n"
        "while 'jsonschema._format' not in sys.modules and time.monotonic() < end:"
        " time.sleep(0.05)\n"
        "print('jsonschema._format' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr

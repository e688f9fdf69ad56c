"""The final check (fidelity.check_output) checks every format jsonschema knows, with its
`format-nongpl` extra, and never passes text it cannot check: a `pattern` Python's `re`
cannot compile is refused at intake, naming it, and reported if it reaches the check."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError, check_output
from sgl_lite.backend.constrained.schema.formats import STRING_FORMATS
from sgl_lite.backend.constrained.schema.schema_normalize import EXTRA_FORMATS
from tests.support import examples
from tests.support.tiny import build_tiny_tokenizer

# (format, a valid value, an invalid one): every format Draft 2020-12 defines
FORMATS = [
    ("date-time", "2020-01-01T10:00:00Z", "2020-01-01"),
    ("date", "2020-02-29", "2020-13-01"),
    ("time", "20:00:00.5-01:00", "25:00:00Z"),
    ("duration", "P1D", "P1"),
    ("email", "a@b.co", "no-at-sign"),
    ("idn-email", "a@b.co", "no-at-sign"),
    ("hostname", "a.example.com", "-bad-"),
    ("idn-hostname", "a.example.com", "-bad-"),
    ("ipv4", "1.2.3.4", "1.2.3.999"),
    ("ipv6", "::1", "1::2::3"),
    ("uri", "https://a.example/x", "no scheme"),
    ("uri-reference", "a/b", "\\\\ bad"),
    ("iri", "https://a.example/é", "no scheme"),
    ("iri-reference", "a/é", "\\\\ bad"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "x"),
    ("uri-template", "/a/{b}", "{unclosed"),
    ("json-pointer", "/a/0", "no-slash"),
    ("relative-json-pointer", "0/a", "x"),
    ("regex", "a+", "[a-"),
]


@pytest.mark.parametrize(("fmt", "valid", "invalid"), FORMATS, ids=[f[0] for f in FORMATS])
def test_every_format_is_checked(fmt: str, valid: str, invalid: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert check_output("json_schema", schema, json.dumps(valid)) is None
    violation = check_output("json_schema", schema, json.dumps(invalid))
    assert violation is not None and f"is not a '{fmt}'" in violation


def test_formats_an_older_draft_lacks_are_checked_as_the_backends_enforce_them() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "format": "uuid"}
    assert check_output("json_schema", schema, '"x"') is not None


COMPILED = {**STRING_FORMATS, **EXTRA_FORMATS}


@pytest.mark.parametrize("fmt", sorted(COMPILED))
@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_what_a_compiled_format_writes_passes_the_check(fmt: str, data: st.DataObject) -> None:
    value = data.draw(st.from_regex(COMPILED[fmt], fullmatch=True))
    assert check_output("json_schema", {"format": fmt}, json.dumps(value)) is None, value


@pytest.mark.parametrize("backend", ["outlines", "auto", "llguidance", "xgrammar"])
def test_a_pattern_python_cannot_compile_is_refused_naming_it(backend: str) -> None:
    compiler = GrammarCompiler(build_tiny_tokenizer(), backend=backend)
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "\\p{L}+"}}}
    with pytest.raises(GrammarError, match=r"properties/x/pattern: '\\\\p\{L\}\+' is not a"):
        compiler.validate("json_schema", schema)


def test_a_pattern_python_cannot_compile_is_a_violation_not_a_pass() -> None:
    schema = {"type": "string", "pattern": "\\p{L}+"}
    violation = check_output("json_schema", schema, '"abc"')
    assert violation is not None and "cannot be checked" in violation
    assert "cannot be checked" in (check_output("regex", "\\p{L}+", "abc") or "")


def test_a_schema_sent_as_text_is_parsed_once_for_every_output_that_uses_it() -> None:
    from sgl_lite.backend.constrained import fidelity

    text = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}})
    before = fidelity._validator.cache_info()
    assert check_output("json_schema", text, '{"n": 3}') is None
    assert "maximum" in (check_output("json_schema", text, '{"n": 30}') or "")
    after = fidelity._validator.cache_info()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 1

"""Exact or refused (issue 37) for a string's `pattern`: the automaton writes a string's JSON
text, so a pattern is translated to match the decoded value, each character as json.dumps
(`ensure_ascii=False`, the way the schema regex writes every literal) spells it. Before, the
pattern was matched on the JSON text itself: `^..$` took `"\\\\"`, one backslash.

The compiled regex is matched with Python's `re` (the automaton's syntax is common to both; a
few cases also walk the real automaton over the tiny tokenizer). A pattern anchored at both
ends is written exactly; an unanchored one as the strings it matches whole (a subset of its
search, `regex_check.pattern_body`); Python's `$` also matches before a final line feed, which
the automaton never writes (a subset).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from sgl_lite.backend.constrained.regex_check import UnsupportedSchema, pattern_body
from sgl_lite.backend.constrained.schema.schema_regex import schema_to_regex
from tests.support import examples
from tests.support.tiny import build_tiny_tokenizer

PATTERNS = [
    "^..$",
    "^[^a]+$",
    "^\\W$",
    "^.{2,3}$",
    "a.c",
    "^[ -~]*$",
    "\\S+",
    "^\\D\\s?$",
    "^[^\\d\\s]$",
    '^("|\\\\)+$',
    "^[\\x00-\\x1f]*$",
    "^[^\\w]+$",
    "^[^a😀]+$",
]
STRINGS = [
    "",
    "ab",
    "abc",
    "abcd",
    "a\\",
    "\\",
    "\\\\",
    '"',
    '""',
    'a"c',
    "a\\c",
    "a\nc",
    "\n",
    "\x00",
    "\x1f\x1c",
    "\t\r",
    "\x08\x0c",
    "\x7f",
    " ",
    "a b",
    "é",
    "日本",
    "😀",
    "٣",
    "_",
    "\u00a0",
    "\u2028",
    "ab\n",
    "\ufeff",
    "\x85",
]


# white space to Python's `re` and not to ECMA-262 (JSON Schema's dialect), or back: a `\s` or
# `\S` writes none of them (string_pattern.ECMA_SPACE)
DISPUTED_SPACE = set("\x1c\x1d\x1e\x1f\x85\ufeff")


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _accepts(regex: str, value: str) -> bool:
    return re.fullmatch(regex, json.dumps(value, ensure_ascii=False)) is not None


def _check(pattern: str, value: str) -> None:
    """Accepted only if valid; accepted exactly when the pattern matches the value whole."""
    schema = {"type": "string", "pattern": pattern}
    regex = schema_to_regex(schema)  # every pattern checked here is translated, none refused
    accepted, valid = _accepts(regex, value), _valid(schema, value)
    assert not accepted or valid, f"{pattern!r} accepts {value!r}, which jsonschema rejects"
    whole = re.fullmatch(pattern_body(pattern), value) is not None
    assert whole or not accepted, f"{pattern!r} accepts {value!r}, which it does not match"
    if ("\\s" in pattern or "\\S" in pattern) and set(value) & DISPUTED_SPACE:
        return  # white space to Python, not to ECMA-262 (or back): never written
    assert accepted == whole, f"{pattern!r} on {value!r}: accepted {accepted}, matched {whole}"
    if pattern.startswith("^") and pattern.endswith("$") and not value.endswith("\n"):
        assert accepted == valid, f"{pattern!r} on {value!r}: accepted {accepted}, valid {valid}"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_accepts_the_json_text_of_exactly_the_strings_it_matches(pattern: str) -> None:
    for value in STRINGS:
        _check(pattern, value)


@pytest.mark.parametrize(
    ("pattern", "widened"),
    [
        ("^..$", "\\"),  # `\\` in the text: two characters, one in the value
        ("^..$", '"'),
        ("^.$", "\n"),  # `\n` in the text; `.` never matches a line feed
        ("^[^a]{2}$", "\\"),
        ("^\\W{2}$", '"'),
        ("^\\S\\S$", "\t"),
        ("^\\D{2}$", "\\"),
        ("^[ -~]{2}$", "\\"),
        ("^[\\\\n]+$", "\n"),  # a backslash and an n: a line feed's text
    ],
)
def test_an_escape_is_one_character_not_the_two_of_its_text(pattern: str, widened: str) -> None:
    schema = {"type": "string", "pattern": pattern}
    assert not _valid(schema, widened)
    assert not _accepts(schema_to_regex(schema), widened)


@pytest.mark.parametrize(
    ("pattern", "value"),
    [("^.$", '"'), ("^.$", "\\"), ("^.$", "\x01"), ("^.$", "\t"), ("^[^a]$", "\n"), ("^.$", "é")],
)
def test_a_class_that_matches_a_quote_backslash_or_control_writes_its_escape(
    pattern: str, value: str
) -> None:
    schema = {"type": "string", "pattern": pattern}
    assert _valid(schema, value) and _accepts(schema_to_regex(schema), value)


def test_a_positive_digit_or_word_is_ascii_and_a_negated_one_excludes_all_of_unicode() -> None:
    digit, word, not_digit, not_word = (
        schema_to_regex({"pattern": p}) for p in ("^\\d$", "^\\w$", "^[^\\d]$", "^\\W$")
    )
    assert _accepts(digit, "3") and not _accepts(digit, "٣")  # subsets of \d and \w
    assert _accepts(word, "_") and not _accepts(word, "é")
    assert not _accepts(not_digit, "٣") and _accepts(not_digit, "a")  # exact for [^\d], \W
    assert not _accepts(not_word, "é") and _accepts(not_word, "\u2028")


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        ("(?i)abc", "inline flags"),
        ("a(?s:.)", "inline flags"),
        ("a*+", "possessive"),
        ("(?>ab)c", "atomic"),
        ("(a$|b)", "anchor"),
        ("[^\\s\\S]", "matches nothing"),
    ],
)
def test_what_is_not_simple_to_translate_is_refused_naming_pattern_and_path(
    pattern: str, what: str
) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}
    with pytest.raises(UnsupportedSchema, match=f"'pattern' at /properties/x .*{what}"):
        schema_to_regex(schema)


@pytest.mark.parametrize(
    ("schema", "fits", "too_long"),
    [
        ({"maxLength": 1}, ["\\", '"', "\n", "é"], ["ab", "\\\\"]),
        ({"minLength": 2}, ['""'], ["\\"]),
    ],
)
def test_lengths_count_decoded_characters_not_escapes(
    schema: dict, fits: list[str], too_long: list[str]
) -> None:
    regex = schema_to_regex({"type": "string", **schema})
    assert all(_accepts(regex, v) for v in fits)
    assert not any(_accepts(regex, v) for v in too_long)


ALPHABET = 'ab "\\\n\t\x00\x1f\x7fé日😀٣\u00a0_'


@pytest.mark.parametrize("pattern", ["^..$", "^[^a]+$", "^\\W+$", "^.{2,3}$", "a.c", "\\S+"])
@settings(max_examples=examples(150), deadline=None)
@given(value=st.text(alphabet=ALPHABET, max_size=4))
def test_random_strings_are_accepted_exactly_when_the_pattern_matches(
    pattern: str, value: str
) -> None:
    _check(pattern, value)


# -- through the compiler: the real automaton, and auto ------------------------------------


@pytest.mark.parametrize("pattern", ["^..$", "^[^a😀]+$", "a.c", "\\S+", "^[ -~]*$", "^\\D$"])
def test_the_automaton_accepts_exactly_the_strings_the_pattern_matches(
    compilers: dict[str, GrammarCompiler], pattern: str
) -> None:
    schema = {"type": "string", "pattern": pattern}
    grammar: Any = compilers["outlines"].compile("json_schema", schema)
    tokenizer = compilers["outlines"].tokenizer

    def accepts(value: str) -> bool:
        state = grammar.initial_state
        text = json.dumps(value, ensure_ascii=False)
        for token in tokenizer.encode(text, add_special_tokens=False):
            state = grammar.next_state(state, token)
            if state is None:
                return False
        return grammar.is_accepting(state)

    for value in STRINGS:
        whole = re.fullmatch(pattern_body(pattern), value) is not None
        if "\\S" in pattern and set(value) & DISPUTED_SPACE:
            whole = False  # white space to ECMA-262 or to Python: never written for `\S`
        assert accepts(value) == whole, (pattern, value)


def test_auto_sends_a_pattern_the_automaton_refuses_to_llguidance(
    compilers: dict[str, GrammarCompiler],
) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?i)abc"}}}
    with pytest.raises(GrammarError, match="'pattern' at /properties/x"):
        compilers["outlines"].plan("json_schema", schema)
    assert compilers["auto"].plan("json_schema", schema)[0] == "llguidance"


SPACE_PATTERNS = ["^\\S$", "^\\s$", "^[x\\S]$", "^[x\\s]$", "^[^x\\s]$", "^[^x\\S]$"]
SPACE_CHARS = "ax \t\u3000\u00a0\ufeff\x85\x1c\x1f"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_white_space_classes_write_what_python_and_ecma_both_match(backend: str) -> None:
    """`\\s` and `\\S` (llguidance: Rust's, rewritten by string_pattern.ecma_spaces) accept a
    character only where Python's `re` (the final check) and ECMA-262 (the JSON Schema Test
    Suite) both match it, and every character they agree on."""
    from bench.json_schema_suite import matcher_for

    compiler = GrammarCompiler(build_tiny_tokenizer(), backend=backend)
    for pattern in SPACE_PATTERNS:
        found = matcher_for(compiler, {"type": "string", "pattern": pattern})
        assert not isinstance(found, str), found
        for ch in SPACE_CHARS:
            accepted = found[1](json.dumps(ch, ensure_ascii=False))
            matched = re.search(pattern, ch) is not None
            if ch in DISPUTED_SPACE:
                assert not accepted, (pattern, ch)
            else:
                assert accepted == matched, (pattern, ch, accepted)

"""The regexes constrained decoding takes: one validator, and the patterns of `dtype=`.

`dtype_to_regex` gives the one pattern of each `gen(dtype=...)` / `gen_int()` type, used by
the frontend and the engine alike. Its numbers have bounded digits (INT_MAX_DIGITS, the bounds
JSON Schema numbers follow too): SGLang's `[-+]?[0-9]+` lets a model write digits until
max_new_tokens runs out.

`validate_regex` is the single check of "can this regex become a finite automaton": the
frontend runs it where `gen(regex=...)` is written and the grammar compiler before it builds an
index, so the two can never disagree. It parses with Python's own regex parser and rejects what
the automaton builder (outlines-core) cannot take: backreferences, conditionals, lookarounds,
word boundaries, and start anchors (`^`, `\\A`) or `\\Z` (the output is matched from its start
anyway; `$` is accepted). tests/unit/test_frontend_common.py checks the two agree.
"""

from __future__ import annotations

import re
import sys
from typing import Any

# NOTE: a version check, not try/except ImportError, so that mypy reads one branch
if sys.version_info >= (3, 11):
    import re._constants as sre_constants
    import re._parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_constants
    import sre_parse


class RegexError(ValueError):
    """A regex that does not parse, or that a finite automaton cannot match."""


_UNSUPPORTED = {
    sre_constants.GROUPREF: "a backreference",
    sre_constants.GROUPREF_EXISTS: "a conditional group",
    sre_constants.ASSERT: "a lookahead/lookbehind",
    sre_constants.ASSERT_NOT: "a negative lookahead/lookbehind",
}
_BOUNDARIES = {sre_constants.AT_BOUNDARY, sre_constants.AT_NON_BOUNDARY}
_ANCHORS = {
    sre_constants.AT_BEGINNING: "^",
    sre_constants.AT_BEGINNING_LINE: "^",
    sre_constants.AT_BEGINNING_STRING: "\\A",
    sre_constants.AT_END_STRING: "\\Z",
}


def validate_regex(pattern: Any, *, what: str = "regex") -> None:
    """Raises `RegexError` (a ValueError) unless `pattern` is a regex a DFA can match.

    `what` names the pattern in the message ("regex", "json_schema pattern", ...).
    """
    if not isinstance(pattern, str):
        raise RegexError(f"{what} must be a string, got {type(pattern).__name__}")
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise RegexError(f"invalid {what} {pattern!r}: {exc}") from None
    stack: list[Any] = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, sre_parse.SubPattern):
            stack.extend(node.data)
        elif isinstance(node, (list, tuple)):
            if len(node) == 2 and node[0] in _UNSUPPORTED:
                raise RegexError(
                    f"invalid {what} {pattern!r}: {_UNSUPPORTED[node[0]]} cannot be compiled "
                    "to a finite automaton"
                )
            if len(node) == 2 and node[0] == sre_constants.AT and node[1] in _BOUNDARIES:
                raise RegexError(f"invalid {what} {pattern!r}: word boundaries are not supported")
            if len(node) == 2 and node[0] == sre_constants.AT and node[1] in _ANCHORS:
                raise RegexError(
                    f"invalid {what} {pattern!r}: the anchor {_ANCHORS[node[1]]} is not "
                    "supported (the output always matches the regex from its start); drop it"
                )
            stack.extend(x for x in node if isinstance(x, (list, tuple, sre_parse.SubPattern)))


# Digits a constrained number may carry: int64's 19 for integers; for other numbers 15 integer
# and 6 fraction digits. JSON Schema numbers follow the same bounds (backend/constrained/schema).
INT_MAX_DIGITS = 19
NUMBER_INT_DIGITS = 15
NUMBER_FRAC_DIGITS = 6

# SGLang's patterns for gen(dtype=...), with bounded digits (SGLang: [-+]?[0-9]+ and
# [-+]?[0-9]*\.?[0-9]+, which let a model write digits until max_new_tokens).
DTYPE_REGEXES: dict[str, str] = {
    "int": rf"[-+]?[0-9]{{1,{INT_MAX_DIGITS}}}",
    "float": rf"[-+]?([0-9]{{1,{NUMBER_INT_DIGITS}}}(\.[0-9]{{1,{NUMBER_FRAC_DIGITS}}})?"
    rf"|\.[0-9]{{1,{NUMBER_FRAC_DIGITS}}})",
    "bool": r"(True|False)",
    "str": r"\"[\w\d\s]*\"",
}
_TYPE_NAMES: dict[object, str] = {int: "int", float: "float", bool: "bool", str: "str"}


def dtype_to_regex(dtype: type | str) -> str:
    """The regex for `int`, `float`, `bool` or `str` (the type or its name)."""
    name = dtype if isinstance(dtype, str) else _TYPE_NAMES.get(dtype)
    if name not in DTYPE_REGEXES:
        raise ValueError(
            f"dtype must be one of int, float, bool, str (or their names), got {dtype!r}"
        )
    return DTYPE_REGEXES[name]

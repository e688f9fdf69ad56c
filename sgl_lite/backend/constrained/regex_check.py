"""Regex checks shared by the compilers: what a finite automaton can match, ASCII digits.

Pure functions over pattern text; nothing here knows about tokenizers or requests.
"""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from typing import Any


class GrammarError(ValueError):
    """A regex, JSON Schema or budget that is invalid, unsupported, or too slow to compile."""


class UnsupportedSchema(GrammarError):
    """A valid JSON Schema the automaton backend cannot enforce exactly (a grammar backend may)."""


def string_patterns(node: Any) -> list[str]:
    """Every `pattern` keyword with a string value in a schema (property names excluded)."""
    found: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                found.append(v)
            else:
                found.extend(string_patterns(v))
    elif isinstance(node, list):
        for v in node:
            found.extend(string_patterns(v))
    return found


_UNSUPPORTED = {
    sre_constants.GROUPREF: "a backreference",
    sre_constants.GROUPREF_EXISTS: "a conditional group",
    sre_constants.ASSERT: "a lookahead/lookbehind",
    sre_constants.ASSERT_NOT: "a negative lookahead/lookbehind",
}
_BOUNDARIES = {sre_constants.AT_BOUNDARY, sre_constants.AT_NON_BOUNDARY}


def check_regex(pattern: str, *, what: str) -> None:
    """Raises GrammarError if `pattern` is not a regex a finite automaton can match."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise GrammarError(f"invalid {what} {pattern!r}: {exc}") from None
    stack: list[Any] = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, sre_parse.SubPattern):
            stack.extend(node.data)
        elif isinstance(node, (list, tuple)):
            if len(node) == 2 and node[0] in _UNSUPPORTED:
                raise GrammarError(
                    f"invalid {what} {pattern!r}: {_UNSUPPORTED[node[0]]} cannot be compiled "
                    "to a finite automaton"
                )
            if len(node) == 2 and node[0] == sre_constants.AT and node[1] in _BOUNDARIES:
                raise GrammarError(f"invalid {what} {pattern!r}: word boundaries are not supported")
            stack.extend(x for x in node if isinstance(x, (list, tuple, sre_parse.SubPattern)))


def digits_to_ascii(regex: str) -> str:
    r"""Rewrites `\d` as ASCII digits (outlines-core's `\d` is Unicode and bloats the automaton)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            if nxt == "d":
                out.append("0-9" if in_class else "[0-9]")
            else:
                out.append(c + nxt)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            if regex[i + 1 : i + 2] == "^":
                out.append("^")
                i += 1
            if regex[i + 1 : i + 2] == "]":  # a literal ] first in a class
                out.append("]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)

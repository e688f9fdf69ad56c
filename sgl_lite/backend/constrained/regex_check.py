"""Regex checks shared by the compilers (what a finite automaton can match, ASCII digits) and
the errors constrained decoding raises.

Pure functions over pattern text; nothing here knows about tokenizers or requests.
"""

from __future__ import annotations

from sgl_lite.common import RegexError, validate_regex


class GrammarError(ValueError):
    """A regex, JSON Schema or budget that is invalid, unsupported, or too slow to compile."""


class UnsupportedSchema(GrammarError):
    """A valid JSON Schema the automaton backend cannot enforce exactly (a grammar backend may)."""


class BudgetError(GrammarError):
    """`max_new_tokens` is below the shortest output the constraint accepts."""


def check_regex(pattern: str, *, what: str) -> None:
    """Raises GrammarError if `pattern` is not a regex a finite automaton can match.

    NOTE: the one validator is `sgl_lite.common.validate_regex`, shared with the frontend so the
    two can never disagree; this only gives its refusal the compiler's error type.
    """
    try:
        validate_regex(pattern, what=what)
    except RegexError as exc:
        raise GrammarError(str(exc)) from None


def pattern_body(pattern: str) -> str:
    """A JSON Schema `pattern` as the regex whose full matches the automaton writes: each
    top-level alternative's leading `^` and trailing unescaped `$` dropped (`^a$|^b$` is
    `a|b`). JSON Schema searches a string for the pattern, so a string the pattern matches
    whole is valid: a subset of the valid strings (all of them where every alternative is
    anchored at both ends)."""
    alternatives = []
    for alternative in _top_level_alternatives(pattern):
        if alternative.startswith("^"):
            alternative = alternative[1:]
        if alternative.endswith("$") and _unescaped_at_end(alternative):
            alternative = alternative[:-1]
        alternatives.append(alternative)
    return "|".join(alternatives)


def _unescaped_at_end(text: str) -> bool:
    """Whether the last character of `text` is not escaped (an even run of backslashes)."""
    run = len(text[:-1]) - len(text[:-1].rstrip("\\"))
    return run % 2 == 0


def _top_level_alternatives(pattern: str) -> list[str]:
    """`pattern` split at the `|` outside every group and character class."""
    parts, start, depth, in_class, i = [], 0, 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a literal ] first in a class
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


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

"""A JSON Schema `pattern` as a regex over the JSON text of the strings it matches.

A `pattern` constrains a string's decoded value; the automaton writes its JSON text, where `"`,
`\\` and control characters are escapes. Each position of the pattern is written as the JSON
text of the characters it matches, spelled as `json.dumps(ensure_ascii=False)` spells them (as
every literal and key of the schema regex is written): `"` as `\\"`, `\\` as `\\\\`, the
short escapes `\\b \\f \\n \\r \\t`, other characters below U+0020 as `\\u00xx`, everything else
raw. So `^..$` writes two characters, never the two of the one-character text `"\\\\"`.

The pattern is read with Python's own parser, the one `jsonschema` matches with, so `.`, a
class, `\\s` and the negations `\\W`, `\\S`, `\\D` mean what the final check means (Unicode
tables, built once from `re`). Sound restrictions: a `\\d` or `\\w` that adds characters is
ASCII (`[0-9]`, `[0-9A-Za-z_]`: Unicode's tables bloat the automaton, and ECMA-262, JSON Schema's
regex dialect, reads them so), while one that removes them (`\\D`, `[^\\w]`) removes every
Unicode digit or word character; a `\\s` that adds characters adds those Python and ECMA-262
both call white space, one that removes them (`\\S`) removes those either does. What is not
simple to translate (inline flags, possessive or atomic repeats, an anchor inside the pattern, a
class that matches nothing) is refused as UnsupportedSchema naming `pattern` and its path, which
`auto` sends to llguidance. Pure functions over pattern text: no tokenizer.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from typing import Any

from sgl_lite.backend.constrained.schema.schema_merge import unsupported

# NOTE: the regex parser Python's own `re` uses (private, stable since 3.11's rename)
_sre: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

Chars = tuple[tuple[int, int], ...]  # sorted, disjoint, non-adjacent (lo, hi) code point ranges

MAX_CODE_POINT = 0x10FFFF
SURROGATES: Chars = ((0xD800, 0xDFFF),)  # never in UTF-8 text: written by no position
ESCAPED: Chars = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))  # what JSON text writes as escapes
_FLAGS_READ = _c.SRE_FLAG_UNICODE | _c.SRE_FLAG_VERBOSE  # str patterns; verbose is syntax only
_META = set(r"\.^$|?*+()[]{}")


def json_pattern(body: str, path: str) -> str:
    """The regex over JSON string contents (no quotes) whose decoded strings are the full
    matches of `body`; UnsupportedSchema names `pattern` at `path` where that is not simple.

    `body` is a `pattern` with its outer anchors dropped (`regex_check.pattern_body`), already
    checked by `check_regex`.
    """
    parsed = _sre.parse(body)
    extra = parsed.state.flags & ~_FLAGS_READ
    if extra:
        raise unsupported("pattern", path, f"inline flags ({re.RegexFlag(extra)!r})")
    return _Translator(path).sequence(parsed)


class _Translator:
    def __init__(self, path: str) -> None:
        self.path = path

    def refuse(self, why: str) -> Exception:
        return unsupported("pattern", self.path, f"{why} is not translated to JSON text")

    def sequence(self, items: Any) -> str:
        return "".join(self.item(op, av) for op, av in items)

    def item(self, op: Any, av: Any) -> str:
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
            chars = _position_chars(op, av, under=True)
            if not chars:
                raise self.refuse("a character class that matches nothing")
            return _written(chars)
        if op is _c.BRANCH:
            return "(" + "|".join(self.sequence(branch) for branch in av[1]) + ")"
        if op is _c.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise self.refuse("a group with inline flags")
            return "(" + self.sequence(body) + ")"
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):  # NOTE: lazy or greedy, the same full matches
            lo, hi, body = av
            return _atom(self.sequence(body)) + _quantifier(lo, hi)
        if op is _c.AT:
            raise self.refuse("an anchor inside the pattern (only a leading ^ and trailing $)")
        raise self.refuse(f"{str(op).lower().replace('_', ' ')}")


_ATOM = re.compile(r"\\?.|\\x..|\\u.{4}|\\U.{8}|\[[^\[\]]*\]", re.DOTALL)


def _atom(regex: str) -> str:
    """`regex` grouped, unless it is one character or one class already."""
    return regex if _ATOM.fullmatch(regex) else f"({regex})"


def _quantifier(lo: int, hi: Any) -> str:
    if hi is _c.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


# -- which characters a position matches ---------------------------------------------------


def _position_chars(op: Any, av: Any, *, under: bool) -> Chars:
    """The code points one position matches: exactly, but for `\\d` and `\\w`, read as ASCII
    where `under` (the set is written) and as Unicode where not (it is removed from another)."""
    if op is _c.LITERAL:
        return ((av, av),)
    if op is _c.NOT_LITERAL:
        return _complement(((av, av),))
    if op is _c.ANY:  # NOTE: no DOTALL (flags are refused): every character but a line feed
        return _complement(((0x0A, 0x0A),))
    if op is _c.RANGE:
        return (av,)
    if op is _c.CATEGORY:
        return _category(av, under=under)
    if op is _c.IN:
        negated = any(item_op is _c.NEGATE for item_op, _ in av)
        parts = [
            _position_chars(item_op, item_av, under=under != negated)
            for item_op, item_av in av
            if item_op is not _c.NEGATE
        ]
        chars = _union(parts)
        return _complement(chars) if negated else chars
    raise ValueError(f"not a character position: {op}")


def _category(category: Any, *, under: bool) -> Chars:
    """`\\d`, `\\w`, `\\s` or a negation; `\\d` and `\\w` as their ASCII subsets where `under`."""
    negated = {_c.CATEGORY_NOT_DIGIT, _c.CATEGORY_NOT_WORD, _c.CATEGORY_NOT_SPACE}
    if category in negated:
        return _complement(_category(_POSITIVE[category], under=not under))
    if under and category in _ASCII:
        return _ASCII[category]
    if category is _c.CATEGORY_SPACE:  # what both Python and ECMA-262 read as white space
        python = _unicode(r"\s")
        return _minus(python, _complement(ECMA_SPACE)) if under else _union([python, ECMA_SPACE])
    return _unicode({_c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_WORD: r"\w"}[category])


# ECMA-262's `\s` (JSON Schema's regex dialect), which differs from Python's: U+FEFF is one,
# U+001C..U+001F and U+0085 are not
ECMA_SPACE: Chars = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)  # fmt: skip
_POSITIVE = {
    _c.CATEGORY_NOT_DIGIT: _c.CATEGORY_DIGIT,
    _c.CATEGORY_NOT_WORD: _c.CATEGORY_WORD,
    _c.CATEGORY_NOT_SPACE: _c.CATEGORY_SPACE,
}
# NOTE: subsets written for `\d` and `\w` (Unicode's 660 digits and 134,000 word characters
# take ~10,000 regex characters and bloat the automaton; llguidance reads them as ASCII too)
_ASCII = {
    _c.CATEGORY_DIGIT: ((0x30, 0x39),),
    _c.CATEGORY_WORD: ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
}


@functools.cache
def _unicode(category: str) -> Chars:
    """The code points Python's `re` matches with `category` (`\\d`, `\\s`, `\\w`)."""
    everything = "".join(map(chr, range(MAX_CODE_POINT + 1)))
    return tuple((m.start(), m.end() - 1) for m in re.finditer(category + "+", everything))


def _of(chars: list[str]) -> Chars:
    return _union([((ord(c), ord(c)),) for c in chars])


def _union(sets: list[Chars]) -> Chars:
    ranges = sorted(r for s in sets for r in s)
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(chars: Chars) -> Chars:
    out, start = [], 0
    for lo, hi in chars:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def _minus(chars: Chars, removed: Chars) -> Chars:
    return _complement(_union([_complement(chars), removed]))


# -- how the matched characters are written ------------------------------------------------


def _written(chars: Chars) -> str:
    """A regex for the JSON text of one character in `chars`: raw, or json.dumps' escape."""
    raw = _minus(chars, _union([ESCAPED, SURROGATES]))
    escaped = [cp for lo, hi in _minus(chars, _complement(ESCAPED)) for cp in range(lo, hi + 1)]
    parts = [_raw_class(raw)] if raw else []
    if escaped:
        # what follows the `\\`: `"`, `n`, ... or `u00` and two hex digits, grouped by the first
        tails = [json.dumps(chr(cp), ensure_ascii=False)[2:-1] for cp in escaped]
        short = [t for t in tails if len(t) == 1]
        after = [_raw_class(_of(short))] if short else []
        for first in dict.fromkeys(t[3] for t in tails if len(t) > 1):
            seconds = [t[4] for t in tails if len(t) > 1 and t[3] == first]
            after.append(f"u00{first}{_raw_class(_of(seconds))}")
        parts.append("\\\\" + _alt(after))
    return _alt(parts)


def _raw_class(chars: Chars) -> str:
    """`chars` (none of them escaped in JSON) as one regex position: a literal, a class, or a
    negated class, whichever lists fewer ranges (surrogates left out: no UTF-8 text has them)."""
    if len(chars) == 1 and chars[0][0] == chars[0][1]:
        return _literal(chars[0][0])
    others = _minus(_complement(chars), SURROGATES)
    negated = len(others) < len(chars)
    listed = others if negated else chars
    body = "".join(
        _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in listed
    )
    return f"[{'^' if negated else ''}{body}]"


def _literal(cp: int) -> str:
    c = chr(cp)
    if c in _META:
        return "\\" + c
    return c if c.isprintable() else _hex(cp)


def _class_char(cp: int) -> str:
    return chr(cp) if chr(cp).isascii() and chr(cp).isalnum() else _hex(cp)


def _hex(cp: int) -> str:
    """A code point as an escape Python's `re` and outlines-core (Rust `regex`) both read."""
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def ecma_spaces(pattern: str) -> str:
    """`pattern` with each `\\s` and `\\S` spelled as the characters that Python (the final
    check), ECMA-262 (JSON Schema's dialect) and Rust's `regex` (llguidance's) all read so:
    `\\s` as the white space all three agree on, `\\S` as what none of them calls white space
    (U+FEFF, U+0085 and U+001C..U+001F are white space to some and not to others). A subset in
    every dialect (inside a negated class, where a `\\s` removes characters, it removes every
    one any dialect calls white space); the result is in Rust's syntax (a class nested in a
    class for `\\S` inside one)."""
    python = _unicode(r"\s")
    rust = _union([ECMA_SPACE, _of(["\x85"])])
    agreed = "".join(
        _class_range(lo, hi)
        for lo, hi in _minus(_minus(python, _complement(ECMA_SPACE)), _complement(rust))
    )
    either = "".join(_class_range(lo, hi) for lo, hi in _union([python, ECMA_SPACE, rust]))
    out, i, where = [], 0, None  # where: None outside a class, else whether it is negated
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            pair, i = pattern[i : i + 2], i + 2
            if pair == "\\s":
                out.append(f"[{agreed}]" if where is None else either if where else agreed)
            elif pair == "\\S":
                out.append(f"[^{agreed}]" if where else f"[^{either}]")
            else:
                out.append(pair)
            continue
        if c == "[" and where is None:
            where = pattern.startswith("^", i + 1)
        elif c == "]" and where is not None:
            where = None
        out.append(c)
        i += 1
    return "".join(out)


def _class_range(lo: int, hi: int) -> str:
    return _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"

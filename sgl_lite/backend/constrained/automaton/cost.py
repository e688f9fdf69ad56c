"""An up-front estimate of what building the automaton's token index for a regex costs.

outlines-core builds the index state by state, walking every vocabulary token from every DFA
state; a state where most bytes continue ("wide": any string character, a Unicode class) lets
most tokens walk their whole length, so the build time grows with the number of wide states
times the vocabulary. The estimate counts those states from the regex's syntax tree, without
building anything (microseconds): a bounded repeat multiplies its body (`"[^"]{1,1024}"` is
about 8,000 wide states: over a minute on SmolLM2's 49,152 tokens), a loop counts its body
once, and Unicode classes (`\\w`, `\\W`, `\\S`, `\\D`) expand into hundreds of UTF-8 states each
(`"[\\w\\d\\s]*"` ran past 10 s), and a bounded repeat of a wide body grows faster than its
copies. `GrammarCompiler` under `auto` sends a regex whose estimate is
over budget to llguidance, which compiles lazily in milliseconds. Pure: no tokenizer, no
outlines-core.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, NamedTuple

# NOTE: the regex parser Python's own `re` uses (private, stable since 3.11's rename)
_sre: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

WIDE_FANOUT = 32  # bytes out of a state that make it wide (as automaton/budget.py counts them)
UTF8_STATES = 8  # wide states of one "any character but a few" position (a JSON string has 8)
# \w and the negated categories: Unicode tables in UTF-8 (\w is 317 byte-DFA states, 223 of
# them wide, and its tokens from every script walk far); weighted as measured: past 10 s
UNICODE_CLASS_STATES = 1000
BOUNDED_WIDE_KNEE = 4  # a bounded repeat of a wide body costs more than its copies beyond this
SPACE_STATES = 4  # \s: a few dozen code points, narrow states
# NOTE: seconds per state on a quiet core for SmolLM2's vocabulary (a wide state walks most
# tokens to their end, a narrow one stops most at their first byte); scaled by vocabulary size
WIDE_STATE_S = 2.5e-3
NARROW_STATE_S = 2.5e-4
REFERENCE_VOCAB = 49_152
MAX_INDEX_S = 1.0  # the compile p95 target: costlier patterns go to a lazy matcher
MAX_REGEX_CHARS = 4000  # longer regexes (large schemas) are costly whatever their shape


class IndexCost(NamedTuple):
    """The estimate for one regex: DFA states, their weight in wide states (a bounded repeat of
    a wide body weighs more than its copies), the seconds that makes for the vocabulary, and
    whether it is over `MAX_INDEX_S` (with why)."""

    states: float
    wide: float
    seconds: float
    reason: str | None

    @property
    def expensive(self) -> bool:
        """Whether `auto` should build this pattern with a lazy matcher instead."""
        return self.reason is not None


def index_cost(regex: str, vocab_size: int = REFERENCE_VOCAB) -> IndexCost:
    """The estimated cost of indexing `regex` over a vocabulary of `vocab_size` tokens."""
    if len(regex) > MAX_REGEX_CHARS:
        why = f"regex over {MAX_REGEX_CHARS} chars"
        return IndexCost(float(len(regex)), 0.0, float("inf"), why)
    try:
        parsed = _sre.parse(regex)
    except (re.error, RecursionError, OverflowError):
        # NOTE: a pattern Python cannot read (outlines-core's syntax differs in a few places):
        # its length alone, which the rule above already bounded
        return IndexCost(float(len(regex)), 0.0, len(regex) * NARROW_STATE_S, None)
    states, wide = _sequence(list(parsed))
    scale = vocab_size / REFERENCE_VOCAB
    seconds = (wide * WIDE_STATE_S + (states - wide) * NARROW_STATE_S) * scale
    reason = None
    if seconds > MAX_INDEX_S:
        reason = (
            f"~{seconds:.1f} s to index {vocab_size} tokens (about {states:.0f} DFA states, "
            f"{wide:.0f} wide-state equivalents)"
        )
    return IndexCost(states, wide, seconds, reason)


def _sequence(items: list[tuple[Any, Any]]) -> tuple[float, float]:
    """(states, wide states) of a concatenation."""
    states = wide = 0.0
    for op, av in items:
        s, w = _item(op, av)
        states += s
        wide += w
    return states, wide


def _item(op: Any, av: Any) -> tuple[float, float]:
    if op is _c.LITERAL:
        return 1.0, 0.0
    if op in (_c.NOT_LITERAL, _c.ANY):
        return float(UTF8_STATES), float(UTF8_STATES)
    if op is _c.IN:
        return _char_class(av)
    if op is _c.BRANCH:
        total = (0.0, 0.0)
        for branch in av[1]:
            s, w = _sequence(list(branch))
            total = (total[0] + s, total[1] + w)
        return total
    if op is _c.SUBPATTERN:
        return _sequence(list(av[-1]))
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) or op is getattr(_c, "POSSESSIVE_REPEAT", None):
        lo, hi, body = av
        s, w = _sequence(list(body))
        if hi is _c.MAXREPEAT:
            return s * (lo + 1), w * (lo + 1)
        # NOTE: measured superlinear: a JSON string of maxLength 8 took 1.9 s to index, of
        # maxLength 16 29 s (loaded machine); the star of the same body 0.2 s
        return s * max(hi, 1), w * max(hi, 1) * max(1.0, hi / BOUNDED_WIDE_KNEE)
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _sequence(list(av))
    return 0.0, 0.0  # anchors, assertions: refused by check_regex or free


def _char_class(items: list[tuple[Any, Any]]) -> tuple[float, float]:
    """(states, wide states) of one `[...]` position."""
    negated = any(op is _c.NEGATE for op, _ in items)
    unicode_class = space = False
    ascii_width = 0
    non_ascii = 0
    for op, av in items:
        if op is _c.LITERAL:
            ascii_width += av < 0x80
            non_ascii += av >= 0x80
        elif op is _c.RANGE:
            lo, hi = av
            ascii_width += max(0, min(hi, 0x7F) - lo + 1)
            non_ascii += max(0, hi - max(lo, 0x80) + 1)
        elif op is _c.CATEGORY:
            if av in (_c.CATEGORY_DIGIT,):
                ascii_width += 10
            elif av in (_c.CATEGORY_SPACE,):
                space = True
            else:  # \w \W \S \D: Unicode tables
                unicode_class = True
    if unicode_class:
        return float(UNICODE_CLASS_STATES), float(UNICODE_CLASS_STATES)
    if negated or non_ascii > WIDE_FANOUT:
        return float(UTF8_STATES), float(UTF8_STATES)
    if space:
        return float(SPACE_STATES), float(ascii_width >= WIDE_FANOUT)
    return 1.0, float(ascii_width >= WIDE_FANOUT)

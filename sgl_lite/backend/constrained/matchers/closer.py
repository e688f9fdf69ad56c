"""The budget guarantee on the grammar backends (llguidance, xgrammar): a deterministic closer.

Neither backend can list its states, so there is no distance table as on the automaton
(budget.py). What both can do cheaply is copy a matcher (~1-2 µs) and try a token on the copy
(<1 µs). The closer walks a copy, token by token, to an accepting state by a fixed policy:

1. with F the bytes the grammar forces from here (the backend's fast-forward, possibly none)
   and P its first byte, then nothing, the first allowed token spelled P + `"}`, P + `"]`,
   P + `}` or P + `]` that closes a structure: neither `"` nor a letter may follow it (inside
   a string, where `}` is only text, `"` may; in llguidance's email format, whose local part
   takes `}` as a letter and cannot end before its `@`, a letter may: taking `}` there looped
   until the cap, and the request lost its budget guarantee);
2. else the first allowed token spelled P + `""`, `"`, `,`, `@`, `1`, `0`, `2`..`9`: an
   empty string, the end of a string, the next required item, an email's `@` (its local part
   otherwise takes digits until the cap), a one-digit number or one character of a string
   that still needs `minLength` (so ` "` is one token where the forced ` ` and `"` are two).
   `1` before `0`: a `format: date` the grammar spells with digits would close as
   `0000-01-01` (year 0, which no date validator accepts) where `1111-11-11` is a date.
   A digit gives way to a line break or space that ends the output within two tokens (with
   `}` or `]` after it): in SGLang's own test regex, `"population": [0-9]+` then a line
   break and `}`, digits are always allowed, and the closer wrote them until its cap;
3. else the longest token spelling a prefix of F, else the backend's first forced token;
4. else the allowed text token with the lowest id (SmolLM2: single bytes come first).

The policy reads nothing but the matcher state, so it is deterministic and memoryless: once the
closer from state s takes its first token c, the closer from s + c is the rest of the same
path. Its length L(s) bounds the shortest completion from above (W3's schema: 18 tokens where
the automaton's exact distance is 16). The budget rule (`ClosingBudget`) keeps a completion
path that fits the tokens left at every step, by induction: a sampled token is kept when one
still fits after it, else replaced by the path's first token. A walk that does not reach an
accepting state within `cap` tokens (a pattern the policy loops in) gives None: the request
then loses the guarantee and a cut output is flagged, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from sgl_lite.backend.constrained.matchers.grammar_mask import unpack_bitmask
from sgl_lite.backend.constrained.vocab import TokenVocabulary

CLOSER_CAP = 256  # the longest completion the closer looks for (tokens)
_MAX_PREFIX = 24  # forced bytes read per step (longer tokens are rare; lookups stay cheap)
_CLOSING = (b'"}', b'"]', b"}", b"]")
_RANKED = (b'""', b'"', b",", b"@", b"1", b"0", *(str(d).encode() for d in range(2, 10)))
_DIGITS = frozenset(str(d).encode() for d in range(10))
_BREAKS = (b"\n", b" ")  # what may end a number before the last closing bracket


class ClosingMatcher(Protocol):
    """A private copy of a backend matcher that the closer may move forward freely."""

    def accepting(self) -> bool:
        """Whether the text so far is complete (the closer stops here)."""

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here, possibly none."""

    def forced_bytes(self) -> bytes:
        """The bytes the grammar forces from here, possibly none."""

    def try_consume(self, token_id: int) -> bool:
        """Consumes `token_id` when the grammar allows it (else leaves the state as it was)."""

    def lowest_allowed(self) -> int | None:
        """The allowed text token (eos excluded) with the lowest id, None if there is none."""

    def allows(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from here, the grammar allows (the state stays)."""

    def completes(self, tokens: list[int]) -> bool:
        """Whether `tokens` from here are allowed and end complete (the state stays)."""


class Ranked(NamedTuple):
    """The vocabulary as the closer reads it: `quote` and `letter` (the ids of `"` and `a`,
    -1 if absent), the text tokens' bytes and their ids by bytes."""

    quote: int
    letter: int
    token_bytes: tuple[bytes | None, ...]
    by_bytes: dict[bytes, int]


def ranked_tokens(vocab: TokenVocabulary) -> Ranked:
    """The closer's view of `vocab` (text tokens only: special ones have no bytes)."""
    by_bytes: dict[bytes, int] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b is not None:
            by_bytes.setdefault(b, i)
    return Ranked(
        by_bytes.get(b'"', -1), by_bytes.get(b"a", -1), tuple(vocab.token_bytes), by_bytes
    )


def closing_path(matcher: ClosingMatcher, ranked: Ranked, cap: int) -> list[int] | None:
    """The closer's tokens from `matcher`'s state to an accepting state (moving `matcher`
    there), or None when it takes more than `cap` tokens or gets stuck."""
    path: list[int] = []
    while not matcher.accepting():
        if len(path) >= cap:
            return None
        token = _step(matcher, ranked, matcher.forced_bytes()[:_MAX_PREFIX])
        if token is None:
            forced = matcher.forced()
            token = forced[0] if forced and matcher.try_consume(forced[0]) else None
        if token is None:
            token = matcher.lowest_allowed()
            if token is None or not matcher.try_consume(token):
                return None
        path.append(token)
    return path


def _step(matcher: ClosingMatcher, ranked: Ranked, forced: bytes) -> int | None:
    """Rules 1 to 3 of the policy over the forced bytes: the token taken (consumed), or None."""
    prefixes = [forced[:1], b""] if forced else [b""]
    # NOTE: a spelling that is only forced text is rule 3's (its longest token), not a choice
    for tail in _CLOSING:
        for prefix in prefixes:
            token = _choice(ranked, forced, prefix + tail)
            if token is not None and _closes(matcher, token, ranked):
                return token
    # The line break that would end a number depends only on the state: looked for once a
    # step, at the first digit spelling, not once per digit.
    looked = False
    ending: int | None = None
    for tail in _RANKED:
        for prefix in prefixes:
            token = _choice(ranked, forced, prefix + tail)
            if token is None:
                continue
            if tail in _DIGITS and not looked:
                looked, ending = True, _ending_break(matcher, ranked)
            if tail in _DIGITS and ending is not None:
                return ending
            if matcher.try_consume(token):
                return token
    for k in range(len(forced), 0, -1):
        token = ranked.by_bytes.get(forced[:k])
        if token is not None and matcher.try_consume(token):
            return token
    return None


def _ending_break(matcher: ClosingMatcher, ranked: Ranked) -> int | None:
    """A line break or space after which the output is complete, alone or with `}` or `]`
    (consumed), or None. Reads only the state, so the policy stays memoryless."""
    for spelling in _BREAKS:
        token = ranked.by_bytes.get(spelling)
        if token is None:
            continue
        brackets = (ranked.by_bytes.get(b) for b in (b"}", b"]"))
        ends = [[token]] + [[token, c] for c in brackets if c is not None]
        if any(matcher.completes(path) for path in ends) and matcher.try_consume(token):
            return token
    return None


def _choice(ranked: Ranked, forced: bytes, spelling: bytes) -> int | None:
    """The token spelled `spelling`, unless there is none or it is only forced text."""
    return None if forced.startswith(spelling) else ranked.by_bytes.get(spelling)


def _closes(matcher: ClosingMatcher, token_id: int, ranked: Ranked) -> bool:
    """Consumes `token_id` if it is allowed and neither `"` nor a letter may follow it (it
    closes a structure: after one, JSON has only `,`, brackets, blanks or the end)."""
    for follower in (ranked.quote, ranked.letter):
        if follower >= 0 and matcher.allows([token_id, follower]) != 1:
            return False  # refused (0) or text that goes on (2)
    return matcher.try_consume(token_id)


class ClosingBudget:
    """The budget rule for one request over a grammar backend.

    It keeps a witness W: a token path from the current state to an accepting state with
    |W| <= tokens left (the closer's path at the start, refused up front where it does not
    fit). A sampled token t is kept when some witness fits after it: W itself when it is
    still a valid completion after t and |W| <= left - 1 (text inside a free string leaves the
    rest of the output as it was), else the closer's path from the state after t. Otherwise t
    is replaced by W's first token, after which W minus that token is a witness. So the
    invariant holds at every step and the output is complete when the budget runs out. A walk
    happens only where a token changes what must follow (a string closed, an item opened).

    `fork()` gives a ClosingMatcher copy of the request's live matcher and `completes(tokens)`
    says whether tokens from the live state end complete, leaving it as it was (xgrammar:
    accepted, then rolled back). Both run on the thread that advances the guide, after the
    step's mask was used, so a mask prefetched on another thread never overlaps a check.
    """

    def __init__(
        self,
        fork: Callable[[], ClosingMatcher],
        completes: Callable[[list[int]], bool],
        ranked: Ranked,
        eos_token_id: int,
        initial_path: list[int] | None,
        cap: int = CLOSER_CAP,
    ) -> None:
        self._fork = fork
        self._completes = completes
        self._ranked = ranked
        self._eos = eos_token_id
        self.cap = cap
        # the witness from the state after `_at` tokens; None: none found
        self._at = 0
        self._path: list[int] | None = None if initial_path is None else list(initial_path)
        self._known = initial_path is not None
        self._pending: tuple[int, list[int], list[int]] | None = None  # checked, not advanced
        self.guarded = True  # a witness fits the tokens left (False: fall back to flagging)
        self.walks = 0  # closer walks after the initial one (for probes)

    def path_here(self, at: int, left: int) -> list[int] | None:
        """The witness from the current state (after `at` tokens), walked if not known."""
        if self._at != at or not self._known:
            self._at, self._path, self._known = at, self._walk([], min(self.cap, left)), True
        return self._path

    def substitute(self, at: int, left: int, token_id: int) -> int:
        """The token to emit for sampled `token_id` with `left` tokens left (this one included):
        `token_id` when a witness fits after it, else the witness's first token (eos where the
        output is already complete). `token_id` unchanged when the budget is loose or the
        guarantee is already lost."""
        # NOTE: with left - 1 >= cap the check can decide nothing: a token whose closer fits
        # the cap fits the budget too, and one whose closer does not could not be judged. So
        # this gate skips only checks that could not change the token (sound); the brief's
        # "left <= 2 L + 16" would skip more, but one token can open a whole required object.
        # Below the cap a check is cheap where it matters most (a free string: W still fits).
        if not self.guarded or left - 1 >= self.cap or token_id == self._eos:
            return token_id
        here = self.path_here(at, left)
        if here is None or len(here) > left:
            self.guarded = False  # a state no closer fits (or none found): report, do not steer
            return token_id
        if here and here[0] == token_id:
            return token_id  # the witness's own step: the rest of it is the next witness
        after = self._fitting([token_id], here, left - 1)
        if after is not None:
            self._pending = (at, [token_id], after)
            return token_id
        return here[0] if here else self._eos

    def fits_forced(self, at: int, left: int, forced: list[int]) -> bool:
        """Whether advancing over `forced` (jump-forward) leaves a witness within budget."""
        if not forced or not self.guarded or left - len(forced) >= self.cap:
            return True
        here = self.path_here(at, left)
        if here is None:
            return True  # no guarantee to keep
        if here[: len(forced)] == forced:
            return len(here) <= left  # the witness's own tokens: the rest of it goes on
        after = self._fitting(forced, here, left - len(forced))
        if after is None:
            return False
        self._pending = (at, list(forced), after)
        return True

    def advanced(self, at: int, token_id: int) -> None:
        """Notes that the guide moved from `at` to `at + 1` tokens over `token_id`."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == at and pending[1][0] == token_id:
            rest = pending[1][1:]
            if rest:
                self._pending = (at + 1, rest, pending[2])
            else:
                self._at, self._path, self._known = at + 1, pending[2], True
            return
        if self._at == at and self._known and self._path and self._path[0] == token_id:
            self._at, self._path = at + 1, self._path[1:]  # the rest of a path is a path
        else:
            self._known = False

    def rolled_back(self) -> None:
        """Forgets the witness (a rollback moved the guide)."""
        self._known, self._pending = False, None

    def _fitting(self, prefix: list[int], here: list[int], cap: int) -> list[int] | None:
        """A witness of at most `cap` tokens after `prefix`: the current one, whole (text in a
        free string, the most common case) or with `prefix` in place of its head (another
        digit, another spelling), where it still completes the output; else the closer's
        path, walked only where the current witness leaves slack (with none, only a path
        shorter than the closer's own would fit, and substituting is as correct and cheaper);
        None when nothing fits."""
        for witness in (here, here[len(prefix) :]):
            if len(witness) <= cap and self._completes(prefix + witness):
                return witness
        return self._walk(prefix, cap) if cap >= len(here) else None

    def _walk(self, prefix: list[int], cap: int) -> list[int] | None:
        self.walks += 1
        matcher = self._fork()
        for token_id in prefix:
            if not matcher.try_consume(token_id):
                return None
        return closing_path(matcher, self._ranked, cap)


def lowest_allowed(words: torch.Tensor, text_mask: torch.Tensor, eos_token_id: int) -> int | None:
    """The lowest-id text token (eos excluded) set in a backend's (W,) int32 bitmask."""
    allowed = unpack_bitmask(words, text_mask.shape[0]) & text_mask
    allowed[eos_token_id] = False
    hit = allowed.nonzero()
    return int(hit[0, 0]) if hit.numel() else None

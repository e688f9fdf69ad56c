"""Incremental detokenization with stop strings and stop regexes (the one owner of both).

Text is decoded a few tokens at a time with two offsets into the output ids, as TGI, vLLM and
mini-sglang do: `prefix` marks where the decode window starts (context for tokenizers that
drop a leading space) and `read` the tokens whose text is already out. Each step decodes
`ids[prefix:read]` and `ids[prefix:]` and takes the difference, once it no longer ends in a
partial UTF-8 character, so a step costs O(1) in the output length.

Decoded text is split in two: *final* text, which no stop string or stop regex can still
match, and a short *pending* tail that might yet become (or already is) a match. Callers
stream the final text only, so nothing downstream holds text back.

The tokenizer only needs `decode(ids, skip_special_tokens=...)`. For a HF fast tokenizer that
adds nothing to its `tokenizers` backend's decode (no override, no space clean-up), the backend
is called directly: the same text without transformers' per-call overhead (~7 µs of ~8), twice
per request per step.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sgl_lite.backend.sampling_params import SamplingParams, compile_stop_regex
from sgl_lite.common.tokenizer import Tokenizer

# Checkpoints kept for `rewind`; jump-forward replaces at most its retokenize window (32
# tokens), and each checkpoint covers at least one token.
_HISTORY = 64


def backend_decoder(tokenizer: Any) -> Callable[[list[int], bool], str] | None:
    """`(ids, skip_special_tokens) -> text` straight from the `tokenizers` backend of a HF fast
    tokenizer whose `decode` is exactly that backend's (transformers' own `decode`/`_decode`,
    `clean_up_tokenization_spaces` off); None for any other tokenizer."""
    transformers = sys.modules.get("transformers")  # not loaded: not a HF tokenizer either
    if transformers is None:
        return None
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    fast = transformers.PreTrainedTokenizerFast
    if not isinstance(tokenizer, fast) or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    decode = getattr(tokenizer.decode, "__func__", None)
    if decode is not PreTrainedTokenizerBase.decode or type(tokenizer)._decode is not fast._decode:
        return None
    backend = tokenizer.backend_tokenizer
    return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)


class StopMatch(NamedTuple):
    """A stop string or regex match in the pending text: `[start, end)`, its text, and the stop
    that matched (the string itself, or the regex's pattern: SGLang's `matched_stop`)."""

    start: int
    end: int
    text: str
    stop: str


class IncrementalDetokenizer:
    """One request's output text, its stop strings and stop regexes."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self._backend_decode = backend_decoder(tokenizer)
        self.skip_special_tokens = params.skip_special_tokens
        self.no_stop_trim = params.no_stop_trim
        self.stops = params.stop
        self.regexes = [compile_stop_regex(p) for p in params.stop_regex]
        self._prefix = 0
        self._read = 0
        # (prefix, read, decoded chars) before each advance, for `rewind`
        self._history: deque[tuple[int, int, int]] = deque(maxlen=_HISTORY)
        self._final_len = 0  # chars of final text so far
        self._unsent: list[str] = []  # final text not yet taken
        self._final: list[str] = []  # all final text, for the constraint check at finish
        self._pending = ""
        self._skip = 0  # chars of re-decoded text that are already final (after a rewind)

    # --- decoding ---------------------------------------------------------------------------
    def feed(self, ids: Sequence[int]) -> StopMatch | None:
        """Decodes the tokens of `ids` (the whole output so far) not read yet; returns the first
        stop match in the pending text, or None (then the text that cannot match is final)."""
        if len(ids) > self._read:
            done = self._decode(ids[self._prefix : self._read])
            text = self._decode(ids[self._prefix :])
            if len(text) > len(done) and not text.endswith("\ufffd"):
                self._history.append((self._prefix, self._read, self._decoded_len))
                self._prefix, self._read = self._read, len(ids)
                self._add(text[len(done) :])
        match = self._first_match()
        if match is None:
            self._release(len(self._pending) - self._hold_len())
        return match

    def rewind(self, keep: int) -> None:
        """The output's ids past `keep` are being replaced (jump-forward retokenized them)."""
        if keep >= self._read:
            return
        state = (0, 0, 0)  # fallback: decode again from the start
        while self._history:
            entry = self._history.pop()
            if entry[1] <= keep:
                state = entry
                break
        self._prefix, self._read, decoded = state
        # NOTE: the replacement decodes to the same text, so what is final stays final; the
        # re-decoded text up to it is skipped, not emitted twice.
        if decoded >= self._final_len:
            self._pending, self._skip = self._pending[: decoded - self._final_len], 0
        else:
            self._pending, self._skip = "", self._final_len - decoded

    def finish(self, ids: Sequence[int], match: StopMatch | None) -> None:
        """Ends the text: trims it at `match` (unless no_stop_trim) or, without a match, makes
        everything final, a trailing partial character included."""
        if match is not None:
            self._release(len(self._pending) if self.no_stop_trim else match.start)
        else:
            if len(ids) > self._read:
                done = self._decode(ids[self._prefix : self._read])
                self._add(self._decode(ids[self._prefix :])[len(done) :])
                self._prefix = self._read = len(ids)
            self._release(len(self._pending))
        self._pending = ""

    def take(self) -> str:
        """The final text produced since the last call."""
        text = "".join(self._unsent)
        self._unsent.clear()
        return text

    @property
    def text(self) -> str:
        """All final text so far (the whole output once the request finished)."""
        if len(self._final) > 1:
            self._final[:] = ["".join(self._final)]
        return self._final[0] if self._final else ""

    @property
    def _decoded_len(self) -> int:
        """Chars of text the read tokens decode to (what is still to be skipped is not)."""
        return self._final_len + len(self._pending) - self._skip

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        if self._backend_decode is not None:
            return self._backend_decode(list(ids), self.skip_special_tokens)
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def _add(self, text: str) -> None:
        if self._skip:
            k = min(self._skip, len(text))
            text, self._skip = text[k:], self._skip - k
        self._pending += text

    def _release(self, n: int) -> None:
        if n > 0:
            self._unsent.append(self._pending[:n])
            self._final.append(self._pending[:n])
            self._final_len += n
            self._pending = self._pending[n:]

    # --- stops ------------------------------------------------------------------------------
    def _first_match(self) -> StopMatch | None:
        text = self._pending
        best: StopMatch | None = None
        for stop in self.stops:
            i = text.find(stop)
            if i >= 0 and (best is None or (i, stop) < (best.start, best.text)):
                best = StopMatch(i, i + len(stop), stop, stop)
        for pattern in self.regexes:
            m = pattern.search(text)
            if m is not None and (best is None or m.start() < best.start):
                best = StopMatch(m.start(), m.end(), m.group(), pattern.pattern)
        return best

    def _hold_len(self) -> int:
        """How much of the pending tail may still grow into a match."""
        text = self._pending
        hold = 0
        if self.stops:
            longest = min(len(text), max(map(len, self.stops)) - 1)
            for k in range(longest, 0, -1):
                if any(stop.startswith(text[-k:]) for stop in self.stops):
                    hold = k
                    break
        for pattern in self.regexes:
            m = pattern.search(text, partial=True)
            if m is not None and m.partial:
                hold = max(hold, len(text) - m.start())
        return hold

"""Logprobs, input and output, in one place: from logits rows to SGLang's entries.

`token_logprobs` is the one tensor computation (log-softmax, the chosen token's value, the top
k); the sampler calls it for sampled tokens and `input_logprobs` for prompt positions. A
request's `LogprobState` turns the numbers into `(logprob, token_id, text|None)` entries and
hands them out as deltas; a request's `token_ids` (SGLang's `token_ids_logprob`) also gets, for
each output token, the logprobs of those ids at that position (what /v1/score reads). SGLang's
convention: `input_token_logprobs` lines up with
`input_ids[logprob_start_len:]` and its first entry's logprob is always None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from sgl_lite.backend.types import LogprobDelta, LogprobEntry, TopEntries

if TYPE_CHECKING:
    from sgl_lite.backend.types import Segment

TokenText = Callable[[int], str | None]


class TokenLogprobs(NamedTuple):
    """Per row: the target token's logprob, the top-k (logprob, token) pairs (k may be 0), and
    the logprobs of the row's chosen token ids (None for a row that named none)."""

    chosen: list[float]
    top: list[list[tuple[float, int]]] | None
    ids: list[list[float] | None] | None = None


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    k: int,
    token_ids: list[tuple[int, ...] | None] | None = None,
) -> TokenLogprobs:
    """logits (R, V), targets (R,) token ids → logprob of each target, the top k per row and,
    per row of `token_ids` that names ids, the logprobs of those ids (full-vocabulary softmax)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    chosen = logprobs.gather(1, targets[:, None].to(logprobs.device)).squeeze(1).tolist()
    ids = None
    if token_ids is not None and any(t for t in token_ids):
        ids = [
            None if not t else logprobs[row, torch.tensor(t, device=logprobs.device)].tolist()
            for row, t in enumerate(token_ids)
        ]
    if k <= 0:
        return TokenLogprobs(chosen, None, ids)
    values, top_ids = logprobs.topk(k, dim=-1)  # (R, k)
    top = [list(zip(v, t)) for v, t in zip(values.tolist(), top_ids.tolist())]
    return TokenLogprobs(chosen, top, ids)


class InputLogprobs(NamedTuple):
    """Prompt logprobs one pass computed: positions `positions` of the prompt, and whether the
    prompt is now complete."""

    positions: list[int]
    values: TokenLogprobs
    done: bool


@dataclass(eq=False)
class LogprobState:
    """One request's logprob settings and the entries not handed out yet."""

    start_len: int  # first prompt position with an entry
    top_k: int = 0
    with_text: bool = False
    token_ids: tuple[int, ...] | None = None  # SGLang's token_ids_logprob (output positions)
    input_done: bool = False
    # top entries computed per prompt position for the radix cache's per-slot store, beyond
    # the `top_k` the request shows (kvcache/logprob_store.py); 0: nothing is stored
    keep_top: int = 0
    # computed prompt entries whose slot did not exist yet (the row after a chunk predicts the
    # next chunk's first token): (position, logprob, top) waiting to be stored
    unstored: list[tuple[int, float, list[tuple[float, int]]]] = field(default_factory=list)
    _first_added: bool = False
    _covered: int = -1  # the last prompt position with an entry (a preempted request repeats)
    _input: list[LogprobEntry] = field(default_factory=list)
    _input_top: list[TopEntries] = field(default_factory=list)
    _output: list[LogprobEntry] = field(default_factory=list)
    _output_top: list[TopEntries] = field(default_factory=list)
    _output_ids: list[TopEntries] = field(default_factory=list)

    def input_logprobs(
        self, input_ids: list[int], segment: Segment, rows: torch.Tensor | None
    ) -> InputLogprobs:
        """The prompt logprobs in a segment's logits `rows` (row j predicts the token after
        position `segment.start + segment.logits_from + j`)."""
        first, n = self.start_len, len(input_ids)
        start = segment.start + segment.logits_from
        count = 0 if rows is None else rows.shape[0]
        # Position `first` itself gets no value (SGLang: the first entry's logprob is None).
        wanted = [j for j in range(count) if first < start + j + 1 < n]
        positions = [start + j + 1 for j in wanted]
        values = TokenLogprobs([], None)
        if wanted:
            assert rows is not None
            targets = torch.tensor([input_ids[p] for p in positions])
            values = token_logprobs(rows[wanted], targets, max(self.top_k, self.keep_top))
        return InputLogprobs(positions, values, start + count >= n - 1 or first >= n)

    def add_input(self, input_ids: list[int], got: InputLogprobs, text: TokenText) -> None:
        """Records prompt logprobs; the entry at `start_len` comes first with a None logprob
        whatever `start_len` is (SGLang's way: it is where the scored span starts)."""
        first = self.start_len
        if not self._first_added and 0 <= first < len(input_ids):
            self._first_added = True
            self._covered = first
            self._input.append((None, input_ids[first], self._text(text, input_ids[first])))
            self._input_top.append(None)
        for j, pos in enumerate(got.positions):
            if pos <= self._covered:  # recomputed after a preemption: already handed out
                continue
            self._covered = pos
            token = input_ids[pos]
            self._input.append((got.values.chosen[j], token, self._text(text, token)))
            self._input_top.append(self._tops(got.values.top, j, text))
        self.input_done = self.input_done or got.done

    def add_output(self, token: int, values: TokenLogprobs, row: int, text: TokenText) -> None:
        """Records a sampled token's logprob (row `row` of the sampler's values)."""
        self._output.append((values.chosen[row], token, self._text(text, token)))
        self._output_top.append(self._tops(values.top, row, text))
        if self.token_ids:
            got = values.ids[row] if values.ids is not None else None
            assert got is not None, "the sampler skipped this request's token_ids"
            self._output_ids.append(
                tuple((v, t, self._text(text, t)) for v, t in zip(got, self.token_ids))
            )

    def take(self) -> LogprobDelta:
        """The entries recorded since the last call."""
        tops = self.top_k > 0
        delta = LogprobDelta(
            input_tokens=tuple(self._input),
            input_top=tuple(self._input_top) if tops else None,
            output_tokens=tuple(self._output),
            output_top=tuple(self._output_top) if tops else None,
            output_token_ids=tuple(self._output_ids) if self.token_ids else None,
        )
        pending_lists = (self._input, self._input_top, self._output, self._output_top)
        for pending in (*pending_lists, self._output_ids):
            pending.clear()
        return delta

    @property
    def needs_input(self) -> bool:
        """Whether prompt logprobs are still to be computed."""
        return self.start_len >= 0 and not self.input_done

    def _text(self, text: TokenText, token: int) -> str | None:
        return text(token) if self.with_text else None

    def _tops(
        self, top: list[list[tuple[float, int]]] | None, row: int, text: TokenText
    ) -> TopEntries:
        if top is None or self.top_k <= 0:
            return None
        return tuple((v, t, self._text(text, t)) for v, t in top[row][: self.top_k])

"""Req: one generation request and its bookkeeping (tokens, slots, tree node, progress).

Per-concern state lives in small objects owned by the module that uses it: logprobs in
`LogprobState` (logprobs.py), the text and its stops in `IncrementalDetokenizer`
(detokenizer.py), the grammar cursor in `Guide` (constrained/).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from sgl_lite.backend.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sgl_lite.backend.constrained import Guide
    from sgl_lite.backend.detokenizer import IncrementalDetokenizer
    from sgl_lite.backend.logprobs import LogprobState
    from sgl_lite.backend.outputs import FinishReason
    from sgl_lite.backend.radix_cache import TreeNode


class ReqStatus(Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    """A request's own state; the scheduler and engine read and update it.

    Token layout: `fill_ids = input_ids + output_ids`. The first `kv_len` of them have K/V in
    the pool at `slot_ids`; of those, the first `prefix_len` belong to the radix tree (held by
    the lock on `last_node`), the rest to this request.
    """

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    logprobs: LogprobState | None = None  # None: no logprobs asked for
    detokenizer: IncrementalDetokenizer | None = None
    output_ids: list[int] = field(default_factory=list)
    slot_ids: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    prefix_len: int = 0
    last_node: TreeNode | None = None
    status: ReqStatus = ReqStatus.WAITING
    finish_reason: FinishReason | None = None
    cached_tokens: int = 0
    guide: Guide | None = None
    grammar_future: Future | None = None
    generator: torch.Generator | None = None
    forced_tokens: int = 0
    ids_sent: int = 0  # output_ids[:ids_sent] were published and not replaced since
    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    arrival: int = 0

    @property
    def fill_ids(self) -> list[int]:
        """Prompt followed by the tokens generated so far."""
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence (prompt + output)."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def kv_len(self) -> int:
        """Tokens whose K/V is in the pool."""
        return len(self.slot_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sampling step."""
        return self.seq_len - self.kv_len

    @property
    def owned_slots(self) -> torch.Tensor:
        """Slots this request owns (not held by the tree)."""
        return self.slot_ids[self.prefix_len :]

    @property
    def needs_input_logprobs(self) -> bool:
        """Whether the prompt's token logprobs are still to be computed."""
        return self.logprobs is not None and self.logprobs.needs_input

    @property
    def is_finished(self) -> bool:
        """Whether the request has ended (finished, stopped or aborted)."""
        return self.status is ReqStatus.FINISHED

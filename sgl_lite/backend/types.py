"""The data that flows down one engine step, at the bottom of the backend's layers.

    RequestBuilder ─► Req ─► Scheduler.schedule() ─► ScheduleBatch (Req + Segment each)
        ─► ModelRunner.forward() ─► ForwardOutput ─► Sampler.sample() ─► Sample per entry
        ─► Scheduler.process() ─► ReqOutput (with a FinishReason once done) ─► the caller

Producers and consumers both import these types from here, so no module has to import the
module that produces its input. Per-concern state a `Req` carries lives in small objects owned
by the module that uses it: logprobs in `LogprobState` (scheduler/logprobs.py), the text and its
stops in `IncrementalDetokenizer` (scheduler/detokenizer.py), the grammar cursor in a `Guide`
(constrained/), the radix node in `TreeNode` (kvcache/radix_cache.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sgl_lite.backend.constrained.protocols import Grammar, Guide
    from sgl_lite.backend.kvcache.radix_cache import TreeNode
    from sgl_lite.backend.scheduler.detokenizer import IncrementalDetokenizer
    from sgl_lite.backend.scheduler.logprobs import InputLogprobs, LogprobState, TokenLogprobs


# --- results: what a request gets back ---


LogprobEntry = tuple[float | None, int, str | None]  # (logprob, token id, text or None)
TopEntries = tuple[LogprobEntry, ...] | None


@dataclass(frozen=True, kw_only=True)
class FinishReason:
    """Why a request ended: SGLang's `{"type": "stop" | "length" | "abort", …}` as data.

    An abort carries the error that caused it (None when a client asked for the abort), so a
    caller picks its answer from the error's type: an `InvalidRequest` (e.g. a grammar that
    failed to compile) is the caller's fault, an `EngineError` the engine's.
    """

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None  # stop: token id, stop string or regex pattern; None: grammar
    length: int | None = None  # length: the max_new_tokens reached
    message: str | None = None  # abort: what happened
    error: Exception | None = field(default=None, compare=False)

    @classmethod
    def stop(cls, matched: int | str | None) -> FinishReason:
        """Stopped by EOS, a stop token, a stop string or regex, or a finished grammar."""
        return cls(type="stop", matched=matched)

    @classmethod
    def length_reached(cls, length: int) -> FinishReason:
        """Stopped at max_new_tokens."""
        return cls(type="length", length=length)

    @classmethod
    def abort(cls, message: str, error: Exception | None = None) -> FinishReason:
        """Ended early: by the client (error None) or by `error`."""
        return cls(type="abort", message=message, error=error)

    @property
    def is_invalid_request(self) -> bool:
        """An abort that was the request's own fault (a 400 over HTTP)."""
        return isinstance(self.error, InvalidRequest)

    def to_dict(self) -> dict[str, Any]:
        """SGLang's wire shape."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass(frozen=True, kw_only=True)
class LogprobDelta:
    """Logprob entries new since the request's previous output; tops are None when unasked."""

    input_tokens: tuple[LogprobEntry, ...] = ()
    input_top: tuple[TopEntries, ...] | None = None
    output_tokens: tuple[LogprobEntry, ...] = ()
    output_top: tuple[TopEntries, ...] | None = None
    # per output token, the logprobs of the request's token_ids_logprob (None when unasked)
    output_token_ids: tuple[TopEntries, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class ReqOutput:
    """One request's progress since its previous output (the first one: since it started)."""

    rid: str
    text: str  # new final text: it can no longer be trimmed by a stop string or regex
    output_ids: tuple[int, ...]  # replace the output's ids from `ids_start` on
    ids_start: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    forced_tokens: int
    e2e_latency: float
    finish_reason: FinishReason | None = None
    logprobs: LogprobDelta | None = None  # None: the request asked for no logprobs
    # budget_closed / constraint_violation of a finished constrained request (Guide.meta_info)
    constraint: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """Whether this is the request's last output."""
        return self.finish_reason is not None


OutputSink = Callable[[ReqOutput], None]
"""Where the loop thread puts a request's outputs; must not block (e.g. `SimpleQueue.put`)."""


# --- requests ---


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
    grammar_future: Future[Grammar] | None = None
    # what serving the constraint leaves unenforced (GrammarCompiler.notes): meta_info's
    # constraint_notes
    constraint_notes: tuple[str, ...] = ()
    generator: torch.Generator | None = None
    # the request's custom logit processor, loaded (scheduler/custom_logits.py); None: none
    custom_logit_processor: Callable[..., torch.Tensor] | None = None
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


# --- one forward pass: what is computed and what comes out ---


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One request's share of a forward pass."""

    token_ids: list[int]  # new tokens whose K/V this pass computes
    start: int  # absolute position of token_ids[0] (= tokens already in the pool)
    kv_slots: torch.Tensor  # (start + len(token_ids),) slots of the whole sequence, new ones last
    logits_from: int  # logits for token_ids[logits_from:] are returned; len(token_ids) for none
    # The segment completes a prompt whose next token is sampled: in the fast mode the runner
    # computes its last token in a pass of single tokens, as a repeat of the request whose
    # whole prompt the radix cache holds computes it (runner/passes.py: split_final_rows).
    last_alone: bool = False

    @property
    def end(self) -> int:
        """Position after the last new token."""
        return self.start + len(self.token_ids)


class ForwardOutput(NamedTuple):
    """Logits rows of a pass: segment i owns rows `ranges[i]` of `logits` (R, vocab)."""

    logits: torch.Tensor | None
    ranges: list[tuple[int, int]]

    def rows(self, i: int) -> torch.Tensor | None:
        """Segment i's logits (n, vocab), or None if it asked for none."""
        start, end = self.ranges[i]
        return self.logits[start:end] if end > start and self.logits is not None else None


@dataclass(frozen=True)
class ScheduleBatch:
    """What one forward pass computes: a segment per request, in the same order."""

    reqs: list[Req]
    segments: list[Segment]

    def completes(self, i: int) -> bool:
        """Whether request i's sequence is fully computed after this pass (it samples next)."""
        return self.segments[i].end == self.reqs[i].seq_len

    def samples(self, i: int) -> bool:
        """Whether request i draws a token from this pass (complete, and asks for tokens)."""
        return self.completes(i) and self.reqs[i].sampling_params.max_new_tokens > 0


class Sample(NamedTuple):
    """What batch entry i got from a pass: its next token (None if it does not sample this
    step) with that token's logprobs (row `row` of `logprobs`), and prompt logprobs."""

    token: int | None = None
    logprobs: TokenLogprobs | None = None
    row: int = 0
    input_logprobs: InputLogprobs | None = None
    error: Exception | None = None  # the request failed this step (its logit processor)

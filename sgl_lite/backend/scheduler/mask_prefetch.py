"""MaskPrefetcher: a step's grammar masks, computed on one worker thread while the forward runs.

The mask a constrained request samples under at step t depends only on its guide's state after
step t-1, and that state is final once the batch is scheduled: `advance()`, rollback and
jump-forward run in `Scheduler.process`, after sampling. So the engine hands the batch to
`start()` just before the forward pass and takes the masks with `PendingMasks.wait()` just
after it. The worker runs only inside that window, when the loop thread is in the forward and
touches no guide, so a guide is never used by two threads at once, and each guide's mask is
computed exactly once per step (the sampler reads the result, it never recomputes it).

Why the two overlap: torch's kernels release the GIL, llguidance fills its bitmask with the GIL
dropped, and outlines-core's masks are mostly memo hits per automaton state; what still holds
the GIL (xgrammar's binding, the bitmask unpacking) then shares it with the forward's Python.

The worker is one thread and runs its own tensor ops on one OpenMP thread, so it never starts a
second OpenMP team beside the forward's (see omp_threads: a second team halves the step's speed).

A mask that raises is that request's error: it comes back in `MaskResults.errors` and the engine
ends that request alone; the step and the other requests go on.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import torch

from sgl_lite.backend.errors import EngineError
from sgl_lite.backend.omp_threads import use_one_omp_thread
from sgl_lite.backend.types import FinishReason, Req

if TYPE_CHECKING:
    from sgl_lite.backend.types import ScheduleBatch

WORKER_NAME = "sgl_lite-masks"


class MaskResults(NamedTuple):
    """A step's masks by request, and the requests whose mask raised (with the exception)."""

    masks: dict[Req, torch.Tensor]
    errors: dict[Req, Exception]


NO_MASKS = MaskResults({}, {})


def compute_masks(reqs: list[Req]) -> MaskResults:
    """Each request's `guide.allowed_mask()`, once; an exception is kept as that request's."""
    masks: dict[Req, torch.Tensor] = {}
    errors: dict[Req, Exception] = {}
    for req in reqs:
        assert req.guide is not None
        try:
            masks[req] = req.guide.allowed_mask()
        except Exception as exc:  # the request's own fault or its backend's: it alone ends
            errors[req] = exc
    return MaskResults(masks, errors)


def mask_failure(exc: Exception) -> FinishReason:
    """How a request whose mask raised ends: an abort carrying an EngineError with the cause."""
    error = EngineError(f"grammar mask failed: {type(exc).__name__}: {exc}")
    return FinishReason.abort(str(error), error)


class PendingMasks:
    """The masks of one step: on the worker (a future) or, without overlap, computed by
    `wait()` on the calling thread."""

    def __init__(
        self,
        reqs: list[Req],
        future: Future[MaskResults] | None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._reqs = reqs
        self._future = future
        self._on_done = on_done

    def wait(self) -> MaskResults:
        """The step's masks, waiting for the worker if it is still computing them. After this
        returns the worker no longer touches these guides."""
        if not self._reqs:
            return NO_MASKS
        if self._future is None:
            return compute_masks(self._reqs)
        try:
            return self._future.result()
        finally:
            if self._on_done is not None:
                self._on_done()


class MaskPrefetcher:
    """Starts each step's mask computation; `overlap=False` computes them after the forward,
    on the loop thread (the behaviour before prefetching, kept for measurement)."""

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self._executor: ThreadPoolExecutor | None = None  # made for the first constrained step
        self._in_flight = False

    def start(self, batch: ScheduleBatch) -> PendingMasks:
        """Submits the masks of the batch's constrained requests that sample this step."""
        reqs = [
            req for i, req in enumerate(batch.reqs) if req.guide is not None and batch.samples(i)
        ]
        if not reqs or not self.overlap:
            return PendingMasks(reqs, None)
        if self._in_flight:  # a step's masks are always waited for before the next step
            raise RuntimeError("the previous step's masks were never waited for")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=WORKER_NAME, initializer=use_one_omp_thread
            )
        self._in_flight = True
        return PendingMasks(reqs, self._executor.submit(compute_masks, reqs), self._landed)

    @property
    def in_flight(self) -> bool:
        """Whether a step's masks were submitted and not yet waited for (never between steps)."""
        return self._in_flight

    def _landed(self) -> None:
        self._in_flight = False

    def shutdown(self) -> None:
        """Stops the worker (after the step it may be computing)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

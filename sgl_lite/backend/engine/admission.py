"""Admission: the waiting-queue bound and the per-request deadlines of one engine.

Callers' threads `admit` requests (a `QueueFull` past `max_queued_requests`, nothing queued then);
the loop thread reports when a request leaves the queue (`started`) or ends (`ended`) and asks
which deadlines have passed (`expired`). A deadline runs from submission, so it bounds the time
a request waits and runs together. A refusal says when to retry (`Retry-After`): the time the
queue, draining at its measured rate, needs to make room. One lock guards the little state there
is; the clock is injectable so tests can drive time.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from sgl_lite.backend.errors import InvalidRequest, QueueFull

RETRY_AFTER_BOUNDS = (1, 60)  # seconds: never "now", never longer than a client waits
DRAIN_WINDOW_S = 60.0  # the drain rate counts the departures of the last minute
_DEPARTURES_KEPT = 256


def check_timeout(value: Any) -> float | None:
    """A request's `timeout` in seconds (None = none); an InvalidRequest unless a number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest("timeout", f"timeout must be a number of seconds, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise InvalidRequest("timeout", f"timeout must be > 0 seconds, got {value!r}")
    return float(value)


class Admission:
    """Counts queued requests against a bound and tracks each request's deadline."""

    def __init__(
        self,
        max_queued: int | None,
        default_timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_queued = max_queued
        self.default_timeout = default_timeout
        self.rejected = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._queued: set[str] = set()  # submitted, not yet admitted to the running batch
        self._deadlines: dict[str, tuple[float, float]] = {}  # rid -> (deadline, seconds)
        self._departures: deque[float] = deque(maxlen=_DEPARTURES_KEPT)  # when each left

    @property
    def num_queued(self) -> int:
        """Requests submitted and not yet running."""
        return len(self._queued)

    def admit(self, rids: list[str], timeout: Any = None) -> None:
        """Counts `rids` as queued with their deadline (the smaller of `timeout` and the
        default); raises QueueFull when they would exceed the bound."""
        asked = check_timeout(timeout)
        limits = [t for t in (asked, self.default_timeout) if t is not None]
        seconds = min(limits) if limits else None
        with self._lock:
            if self.max_queued is not None and len(self._queued) + len(rids) > self.max_queued:
                self.rejected += 1
                retry = self._retry_after(len(self._queued) + len(rids) - self.max_queued)
                raise QueueFull(
                    f"the server is overloaded: {len(self._queued)} requests are queued "
                    f"(max_queued_requests={self.max_queued}); retry in {retry} s",
                    retry_after=retry,
                )
            self._queued.update(rids)
            if seconds is not None:
                deadline = self._clock() + seconds
                self._deadlines.update((rid, (deadline, seconds)) for rid in rids)

    def started(self, reqs: Iterable[Any]) -> None:
        """The loop scheduled these requests: they no longer count as queued."""
        now = self._clock()
        with self._lock:
            for req in reqs:
                if req.rid in self._queued:
                    self._queued.discard(req.rid)
                    self._departures.append(now)

    def ended(self, rid: str) -> None:
        """A request finished (any reason): forget it. One that ends while queued (aborted,
        timed out) made room too, so it counts as a departure."""
        now = self._clock()
        with self._lock:
            if rid in self._queued:
                self._queued.discard(rid)
                self._departures.append(now)
            self._deadlines.pop(rid, None)

    def expired(self) -> list[tuple[str, float]]:
        """(rid, its timeout in seconds) of each request past its deadline, still tracked."""
        if not self._deadlines:
            return []
        now = self._clock()
        with self._lock:
            return [(rid, secs) for rid, (dl, secs) in self._deadlines.items() if dl <= now]

    def drain_rate(self) -> float | None:
        """Requests leaving the queue per second over the last DRAIN_WINDOW_S (None: fewer than
        two left in that window, so there is no measurement)."""
        with self._lock:
            return self._drain_rate(self._clock())

    def _drain_rate(self, now: float) -> float | None:
        recent = [t for t in self._departures if now - t <= DRAIN_WINDOW_S]
        if len(recent) < 2:
            return None
        # The intervals between departures, the last one running up to now: a stalled queue's
        # rate decays instead of staying at what it was before the stall.
        return (len(recent) - 1) / max(now - recent[0], 1e-3)

    def _retry_after(self, room_needed: int) -> int:
        """Whole seconds until `room_needed` requests have left the queue at its drain rate,
        within RETRY_AFTER_BOUNDS; the lower bound when nothing has been measured yet (the
        retry then meets a measured queue)."""
        low, high = RETRY_AFTER_BOUNDS
        rate = self._drain_rate(self._clock())
        if rate is None:
            return low
        return int(min(max(math.ceil(room_needed / rate), low), high))

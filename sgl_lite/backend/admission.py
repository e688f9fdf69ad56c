"""Admission: the waiting-queue bound and the per-request deadlines of one engine.

Callers' threads `admit` requests (a `QueueFull` past `max_queued_requests`, nothing queued then);
the loop thread reports when a request leaves the queue (`started`) or ends (`ended`) and asks
which deadlines have passed (`expired`). A deadline runs from submission, so it bounds the time
a request waits and runs together. One lock guards the little state there is.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from sgl_lite.backend.errors import InvalidRequest, QueueFull


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

    def __init__(self, max_queued: int | None, default_timeout: float | None) -> None:
        self.max_queued = max_queued
        self.default_timeout = default_timeout
        self.rejected = 0
        self._lock = threading.Lock()
        self._queued: set[str] = set()  # submitted, not yet admitted to the running batch
        self._deadlines: dict[str, tuple[float, float]] = {}  # rid -> (deadline, seconds)

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
                raise QueueFull(
                    f"the server is overloaded: {len(self._queued)} requests are queued "
                    f"(max_queued_requests={self.max_queued}); retry later"
                )
            self._queued.update(rids)
            if seconds is not None:
                deadline = time.monotonic() + seconds
                self._deadlines.update((rid, (deadline, seconds)) for rid in rids)

    def started(self, reqs: Iterable[Any]) -> None:
        """The loop scheduled these requests: they no longer count as queued."""
        with self._lock:
            self._queued.difference_update(r.rid for r in reqs)

    def ended(self, rid: str) -> None:
        """A request finished (any reason): forget it."""
        with self._lock:
            self._queued.discard(rid)
            self._deadlines.pop(rid, None)

    def expired(self) -> list[tuple[str, float]]:
        """(rid, its timeout in seconds) of each request past its deadline, still tracked."""
        if not self._deadlines:
            return []
        now = time.monotonic()
        with self._lock:
            return [(rid, secs) for rid, (dl, secs) in self._deadlines.items() if dl <= now]

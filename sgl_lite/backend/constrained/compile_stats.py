"""CompileStats: a cumulative histogram of one compiler's grammar builds (for /metrics).

Standard library only and thread-safe: builds end on worker threads, readers take a
`snapshot()` (plain JSON, as `get_server_info` returns it) from any thread.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

# SGLang's grammar_compilation_time_seconds buckets (python/sglang/srt/metrics/collector.py)
BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class CompileStats:
    """Counts of grammar builds by duration bucket, their total time, and the failures."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"buckets must be increasing and non-empty, got {buckets}")
        self.buckets = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one: above every bound
        self._sum = 0.0
        self._failures = 0
        self._lock = threading.Lock()

    def record(self, seconds: float, ok: bool) -> None:
        """One build took `seconds`; `ok` False when it raised."""
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
            self._sum += seconds
            self._failures += not ok

    def snapshot(self) -> dict[str, Any]:
        """`{"count", "sum", "failures", "buckets": [[bound, cumulative count], ...,
        ["+Inf", count]]}`."""
        with self._lock:
            counts, total, failures = list(self._counts), self._sum, self._failures
        cumulative, running = [], 0
        for bound, n in zip((*self.buckets, "+Inf"), counts):
            running += n
            cumulative.append([bound, running])
        return {"count": running, "sum": total, "failures": failures, "buckets": cumulative}

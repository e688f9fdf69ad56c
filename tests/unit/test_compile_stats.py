"""CompileStats: the cumulative histogram of grammar builds that /metrics exposes."""

from __future__ import annotations

import pytest

from sgl_lite.backend.constrained.compile_stats import CompileStats


def test_snapshot_is_cumulative_with_prometheus_le_semantics():
    stats = CompileStats(buckets=(0.1, 1.0))
    for seconds, ok in ((0.05, True), (0.1, True), (0.5, False), (3.0, True)):
        stats.record(seconds, ok)
    snap = stats.snapshot()
    # a value equal to a bound falls in that bound's bucket (le = "less or equal")
    assert snap["buckets"] == [[0.1, 2], [1.0, 3], ["+Inf", 4]]
    assert snap["count"] == 4 and snap["failures"] == 1
    assert snap["sum"] == pytest.approx(3.65)


def test_empty_stats_and_bad_buckets():
    assert CompileStats(buckets=(1.0,)).snapshot() == {
        "count": 0,
        "sum": 0.0,
        "failures": 0,
        "buckets": [[1.0, 0], ["+Inf", 0]],
    }
    for bad in ((), (1.0, 0.5), (1.0, 1.0)):
        with pytest.raises(ValueError, match="buckets"):
            CompileStats(buckets=bad)

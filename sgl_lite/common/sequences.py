"""Token-sequence helpers shared by select scoring, the radix cache and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_len(a: Sequence[object], b: Sequence[object], start: int = 0) -> int:
    """How many items `a` and `b[start:]` share from their beginnings.

    `start` lets a caller compare against the rest of a longer sequence without slicing it
    (the radix cache walks one token list from a moving position).
    """
    if start < 0:
        raise ValueError(f"common_prefix_len: start must be >= 0, got {start}")
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i

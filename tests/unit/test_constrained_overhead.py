"""bench.constrained_overhead's bookkeeping, model-free: a leaf call inside another leaf call
is not counted twice while a container leaves the leaves inside it counted, only steady decode
steps are summarized, and the loop-thread overhead takes the unconstrained baseline off."""

from __future__ import annotations

import pytest

from bench.constrained_overhead import StepClock, overhead_ms, summarize


def test_a_leaf_inside_a_leaf_is_counted_once_and_containers_keep_their_leaves() -> None:
    clock = StepClock()
    inner = clock.wrap("inner", lambda: None)
    outer = clock.wrap("outer", lambda: inner())
    container = clock.wrap("container", lambda: inner(), leaf=False)
    outer()
    assert set(clock.take()) == {"outer", "outer_cpu"}
    container()
    assert set(clock.take()) == {"container", "container_cpu", "inner", "inner_cpu"}
    assert clock.take() == {}


def test_only_steady_decode_steps_are_summarized() -> None:
    steps = [
        {"n": 16, "decode": False, "step": 9.0, "forward": 8.0},  # a prefill
        {"n": 16, "decode": True, "step": 0.2, "forward": 0.1, "guide_loop": 0.01},
        {"n": 15, "decode": True, "step": 0.2, "forward": 0.1, "guide_loop": 0.01},
        {"n": 4, "decode": True, "step": 1.0, "forward": 0.5},  # the tail
    ]
    got = summarize(steps, 16)
    assert got["steps"] == 2
    assert got["forward_ms"] == pytest.approx(100.0)
    assert got["guide_loop_ratio"] == pytest.approx(0.1)


def test_the_overhead_takes_the_unconstrained_submit_and_apply_off() -> None:
    constrained = {"mask_start_ms": 2.0, "mask_wait_ms": 0.5, "mask_apply_ms": 1.0}
    constrained["guide_loop_ms"] = 3.0
    baseline = {"mask_start_ms": 0.5, "mask_wait_ms": 0.5, "mask_apply_ms": 0.5}
    assert overhead_ms(constrained, baseline) == pytest.approx(5.0)

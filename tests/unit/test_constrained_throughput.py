"""bench.constrained_throughput's A/B pairing, model-free: the unconstrained arm asks for exactly
the constrained arm's output length per request (ignore_eos, no schema), in either order, and
the ratio is the constrained arm's tokens/s over the unconstrained one's."""

from __future__ import annotations

from typing import Any

import pytest

from bench.constrained_overhead import StepClock
from bench.constrained_throughput import ab_pair


class FakeEngine:
    """async_generate: a constrained request stops at its own length (3 + its index), an
    unconstrained one runs to max_new_tokens; every request is recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def async_generate(self, input_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        self.calls.append(sampling_params)
        if "json_schema" in sampling_params:
            tokens = min(3 + input_ids[0], sampling_params["max_new_tokens"])
        else:
            tokens = sampling_params["max_new_tokens"]
        return {"text": "", "meta_info": {"completion_tokens": tokens}}


@pytest.mark.parametrize("first", [True, False])
def test_the_free_arm_matches_the_constrained_lengths(first: bool) -> None:
    engine = FakeEngine()
    prompts = [[i] for i in range(4)]
    pair = ab_pair(engine, StepClock(), prompts, ["{}"] * 4, 64, 0.8, first=first)
    assert pair["constrained"]["tokens"] == [3, 4, 5, 6]
    assert pair["free"]["tokens"] == [3, 4, 5, 6]
    assert pair["length_mismatches"] == 0
    free = [c for c in engine.calls if "json_schema" not in c]
    assert [c["max_new_tokens"] for c in free] == [3, 4, 5, 6]
    assert all(c["ignore_eos"] for c in free)
    constrained = [c for c in engine.calls if "json_schema" in c]
    assert all(c["max_new_tokens"] == 64 and not c.get("ignore_eos") for c in constrained)
    assert len(constrained) == (4 if first else 8)  # free first: one untimed run for lengths
    c, f = pair["constrained"], pair["free"]
    assert pair["ratio"] == pytest.approx(c["tokens_per_s"] / f["tokens_per_s"], abs=1e-3)

"""The deterministic mode (`enable_deterministic_inference`: the GGUF's int4 codes on every
pass, float64 attention) computes a token's K/V and logits to the same bits whichever pass
computes it: one prefill, a cached prefix plus decode steps, or decode steps beside another
request of a different length (padded attention). That is what keeps greedy output identical
with the radix cache on and off."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.types import Segment

PROMPT_LEN, OTHER_LEN = 80, 37


@pytest.fixture(scope="module")
def auto_runner(smollm_folder) -> ModelRunner:
    runner = ModelRunner(
        smollm_folder,
        EngineConfig(max_total_tokens=1024, device="cpu", enable_deterministic_inference=True),
    )
    assert runner.format.int_kind == "int4", runner.format.describe()
    return runner


def _run(runner: ModelRunner, ids: list[int], chunks: list[int], other: list[int] | None):
    """Feeds `ids` in `chunks`; `other` (if given) is prefilled first, then decodes one token
    beside each of ids' decode steps. Returns the last logits row and every layer's K/V."""
    pool = runner.pool
    slots = pool.alloc(len(ids))
    other_slots = pool.alloc(len(other)) if other else None
    other_pos = 30
    if other:
        seg = Segment(token_ids=other[:30], start=0, kv_slots=other_slots[:30], logits_from=30)
        runner.forward([seg])
    pos, last = 0, None
    for size in chunks:
        segs = [
            Segment(
                token_ids=ids[pos : pos + size],
                start=pos,
                kv_slots=slots[: pos + size],
                logits_from=size - 1,
            )
        ]
        if other and size == 1 and other_pos < len(other):
            segs.append(
                Segment(
                    token_ids=other[other_pos : other_pos + 1],
                    start=other_pos,
                    kv_slots=other_slots[: other_pos + 1],
                    logits_from=0,
                )
            )
            other_pos += 1
        last = runner.forward(segs).rows(0)[-1].clone()
        pos += size
    kv = [
        (pool.k_layers[layer][slots].clone(), pool.v_layers[layer][slots].clone())
        for layer in range(len(pool.k_layers))
    ]
    pool.free(slots)
    if other_slots is not None:
        pool.free(other_slots)
    return last, kv


@pytest.mark.parametrize(
    "chunks, with_other",
    [
        ([50] + [1] * 30, False),  # a cached prefix, then decode steps
        ([20, 30] + [1] * 30, True),  # chunked prefill, then decodes padded beside another
        ([1] * PROMPT_LEN, False),  # every token a decode step
    ],
    ids=["prefix+decode", "chunks+batched-decode", "all-decode"],
)
def test_token_kv_and_logits_are_the_same_bits_in_every_pass_shape(auto_runner, chunks, with_other):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (PROMPT_LEN,), generator=gen).tolist()
    other = torch.randint(100, 20000, (OTHER_LEN,), generator=gen).tolist()
    ref_logits, ref_kv = _run(auto_runner, ids, [PROMPT_LEN], None)
    logits, kv = _run(auto_runner, ids, chunks, other if with_other else None)
    for layer, ((k_ref, v_ref), (k, v)) in enumerate(zip(ref_kv, kv)):
        assert torch.equal(k_ref, k) and torch.equal(v_ref, v), f"layer {layer} K/V differ"
    assert torch.equal(ref_logits, logits)

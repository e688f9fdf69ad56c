"""Decode steps over K/V kept gathered between steps equal steps that gather from the pool."""

from __future__ import annotations

import torch

from sgl_lite.backend.runner.decode_kv import ROUND, DecodeKV
from sgl_lite.backend.types import Segment
from tests.support.tiny import prefill_random, tiny_runner


def _decode(runner, seqs, steps: int, kept: bool) -> list[torch.Tensor]:
    """Greedy-free decode: feeds fixed tokens so both runs see the same inputs."""
    runner.decode_kv = DecodeKV(runner.pool) if kept else None
    out = []
    lengths = [len(ids) - 1 for ids, _ in seqs]
    for step in range(steps):
        # request 1 leaves after 4 steps; a prefill chunk of request 0 never happens here, but
        # a batch-size change must start fresh copies
        active = [i for i in range(len(seqs)) if not (i == 1 and step >= 4)]
        segments = []
        for i in active:
            ids, slots = seqs[i]
            n = lengths[i]
            segments.append(
                Segment(
                    token_ids=[(7 * step + i) % 200],
                    start=n,
                    kv_slots=slots[: n + 1],
                    logits_from=0,
                )
            )
            lengths[i] += 1
        out.append(runner.forward(segments).logits)
    return out


def test_kept_copies_give_the_same_logits_as_gathering():
    base = tiny_runner()
    seqs = prefill_random(base, [5, 40, 17])
    # room for 12 more tokens per request: reallocate slots with headroom
    grown = []
    for ids, slots in seqs:
        extra = base.pool.alloc(12)
        grown.append((ids, torch.cat([slots[:-1], extra])))
    snapshot = (base.pool.k.clone(), base.pool.v.clone())
    gathered = _decode(base, grown, 10, kept=False)
    base.pool.k.copy_(snapshot[0])
    base.pool.v.copy_(snapshot[1])
    kept = _decode(base, grown, 10, kept=True)
    assert base.decode_kv._shape == (2, ROUND)  # copies followed the batch down to 2 rows
    for a, b in zip(gathered, kept):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5


def test_any_pass_that_is_not_a_decode_step_resets_the_copies():
    runner = tiny_runner()
    kv = DecodeKV(runner.pool)
    slots = runner.pool.alloc(20)
    step = [Segment(token_ids=[1], start=9, kv_slots=slots[:10], logits_from=0)]
    assert kv.plan(step).fresh
    nxt = [Segment(token_ids=[1], start=10, kv_slots=slots[:11], logits_from=0)]
    assert not kv.plan(nxt).fresh
    chunk = [Segment(token_ids=[1, 2], start=11, kv_slots=slots[:13], logits_from=0)]
    assert kv.plan(chunk) is None
    after = [Segment(token_ids=[1], start=13, kv_slots=slots[:14], logits_from=0)]
    assert kv.plan(after).fresh
    other = runner.pool.alloc(15)
    swapped = [Segment(token_ids=[1], start=14, kv_slots=other[:15], logits_from=0)]
    assert kv.plan(swapped).fresh  # a different request in the same batch position

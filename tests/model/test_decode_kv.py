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


def test_copies_are_sized_to_the_batch_not_to_the_longest_earlier_one():
    """A long request's copies do not size a later batch's: the capacity is kept only for a
    batch of the same size that it holds with at most twice the positions it needs."""
    runner = tiny_runner()
    kv = DecodeKV(runner.pool, max_bytes=None)
    slots = runner.pool.alloc(3 * ROUND)

    def step(rows: int, length: int) -> int:
        segments = [
            Segment(token_ids=[1], start=length - 1, kv_slots=slots[:length], logits_from=0)
            for _ in range(rows)
        ]
        view = kv.plan(segments)
        assert view is not None and view.k_all.shape[1] == rows
        return view.capacity

    assert step(1, 3 * ROUND) == 3 * ROUND  # one long request
    assert step(4, 10) == ROUND  # a new batch of short ones: sized to them
    assert step(4, ROUND + 5) == 2 * ROUND  # grows with them
    assert step(4, ROUND - 3) == 2 * ROUND  # same size, within twice the need: kept
    assert step(4, 2 * ROUND + 5) == 3 * ROUND
    assert step(4, 5) == ROUND  # more than twice: sized down
    assert kv.nbytes == 2 * runner.pool.num_layers * 4 * runner.pool.num_kv_heads * ROUND * (
        runner.pool.head_dim * kv.dtype.itemsize
    )


def test_eight_decode_rows_over_the_copies_whole_capacity_match_sdpa(monkeypatch):
    """From DECODE_OVER_COPIES_MIN_ROWS bf16 decode rows, attention reads the copies' whole
    capacity with the positions past each row masked: stale values there (a longer earlier
    batch's) change nothing, and the logits match SDPA's over the used part to bf16 rounding."""
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner.decode_attention import DECODE_OVER_COPIES_MIN_ROWS
    from sgl_lite.backend.runner.models.attention import Attention

    runner = tiny_runner()
    pool = runner.pool
    runner.pool = KVPool(
        num_layers=pool.num_layers,
        num_slots=pool.num_slots,
        num_kv_heads=pool.num_kv_heads,
        head_dim=pool.head_dim,
        dtype=torch.bfloat16,
        scratch_slots=1,
    )
    lengths = [5, 40, 17, 9, 30, 3, 22, 11][:DECODE_OVER_COPIES_MIN_ROWS]
    seqs = [
        (ids, torch.cat([s[:-1], runner.pool.alloc(8)]))
        for ids, s in prefill_random(runner, lengths)
    ]
    snapshot = (runner.pool.k.clone(), runner.pool.v.clone())
    calls = []
    original = Attention._decode_over_copies

    def counted(self, *args):
        calls.append(self.layer_id)
        return original(self, *args)

    monkeypatch.setattr(Attention, "_decode_over_copies", counted)
    runs = {}
    for over_copies in (False, True):
        runner.pool.k.copy_(snapshot[0])
        runner.pool.v.copy_(snapshot[1])
        monkeypatch.setattr(Attention, "plain_softmax", over_copies)
        runner.decode_kv = DecodeKV(runner.pool)
        logits, lens = [], [len(ids) - 1 for ids, _ in seqs]
        for step in range(6):
            segments = [
                Segment(
                    token_ids=[(5 * step + i) % 200], start=n, kv_slots=s[: n + 1], logits_from=0
                )
                for i, ((_, s), n) in enumerate(zip(seqs, lens))
            ]
            logits.append(runner.forward(segments).logits)
            lens = [n + 1 for n in lens]
            if step == 0:  # what a longer batch of this size left in the copies past every row
                copies = runner.decode_kv
                copies._k_all[..., max(lens) :, :] = 1e3
                copies._v_all[..., max(lens) :, :] = -1e3
        runs[over_copies] = torch.stack(logits)
    assert len(calls) == 6 * len(runner.model.layers)  # every layer of every step took the path
    assert runner.decode_kv._shape[1] > max(lens)  # the copies had room past the longest row
    reference, over = runs[False], runs[True]
    assert torch.isfinite(over).all()
    assert (over - reference).abs().max() <= 0.02 * reference.abs().max()
    assert torch.equal(over.argmax(-1), reference.argmax(-1))

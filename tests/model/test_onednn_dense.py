"""Dense weights held in oneDNN's layout compute the same bits as the plain ones, and decode
steps of any batch size read the kept copies instead of re-gathering the pool."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgl_lite.backend.runner.decode_kv import DecodeKV
from sgl_lite.backend.runner.weights import onednn
from sgl_lite.backend.runner.weights.linear import Linear
from sgl_lite.backend.types import Segment
from tests.support.tiny import DECODE_VOCAB, prefill_random, tiny_runner

needs_bf16 = pytest.mark.skipif(
    onednn.why_not(torch.empty(2, 2, dtype=torch.bfloat16)) is not None,
    reason="this CPU or torch build has no oneDNN bf16 product",
)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 64, 200])
def test_prepacked_product_is_the_plain_product_bit_for_bit(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 80, generator=gen).to(torch.bfloat16)
    packed = onednn.prepack(weight)
    assert packed is not None
    got = onednn.linear(x, packed, bias)
    assert torch.equal(got, F.linear(x, weight, bias))
    # a row's bits do not depend on the rows beside it
    assert torch.equal(onednn.linear(x[:1], packed, bias), got[:1])


def test_float32_and_meta_weights_stay_plain():
    assert onednn.prepack(torch.randn(8, 8)) is None  # float32 keeps MKL's own path
    linear = Linear(8, 8, device="meta", dtype=torch.bfloat16)
    assert not linear.prepack_dense() and linear.prepacked is None


@needs_bf16
def test_a_prepacked_linear_frees_its_plain_weight_and_runs_the_same():
    linear = Linear(40, 24, bias=True).to(torch.bfloat16)
    x = torch.randn(5, 40).to(torch.bfloat16)
    want = linear.run(x, use_int=False)
    assert linear.prepack_dense()
    assert linear.weight.numel() == 0 and linear.has_dense
    assert torch.equal(linear.run(x, use_int=False), want)


def _bf16_runner():
    runner = tiny_runner()
    runner.model.to(torch.bfloat16)
    runner.pool.k = runner.pool.k.to(torch.bfloat16)
    runner.pool.v = runner.pool.v.to(torch.bfloat16)
    runner.pool.k_layers, runner.pool.v_layers = list(runner.pool.k), list(runner.pool.v)
    return runner


@needs_bf16
def test_a_bf16_model_gives_the_same_logits_prepacked_as_plain():
    plain, packed = _bf16_runner(), _bf16_runner()
    assert packed.model.prepack_dense() == 2 * 4 + 1  # four linears a layer, the tied head
    for runner in (plain, packed):
        runner.decode_kv = DecodeKV(runner.pool)
    lengths = [7, 30, 12]
    outs = []
    for runner in (plain, packed):
        seqs = prefill_random(runner, lengths)
        segments = [
            Segment(token_ids=[ids[-1]], start=len(ids) - 1, kv_slots=slots, logits_from=0)
            for ids, slots in seqs
        ]
        outs.append(runner.forward(segments).logits)
    assert torch.equal(outs[0], outs[1])


def test_decode_batches_above_sixteen_rows_keep_their_copies():
    """A 20-row batch's second step appends to the kept copies (no fresh gather), with the
    logits of the step that gathers from the pool."""
    runner = tiny_runner()
    seqs = prefill_random(runner, [3 + i for i in range(20)])
    grown = [(ids, torch.cat([slots, runner.pool.alloc(2)])) for ids, slots in seqs]
    snapshot = (runner.pool.k.clone(), runner.pool.v.clone())

    def two_steps(copies):
        runner.pool.k.copy_(snapshot[0])
        runner.pool.v.copy_(snapshot[1])
        runner.decode_kv = copies
        logits, fresh = [], []
        if copies is not None:
            plan = copies.plan

            def recorded(segments, extend=False):
                view = plan(segments, extend)
                fresh.append(None if view is None else view.fresh)
                return view

            copies.plan = recorded
        for step in range(2):
            segments = [
                Segment(
                    token_ids=[(5 * step + b) % DECODE_VOCAB],
                    start=len(ids) - 1 + step,
                    kv_slots=slots[: len(ids) + step],
                    logits_from=0,
                )
                for b, (ids, slots) in enumerate(grown)
            ]
            logits.append(runner.forward(segments).logits)
        return logits, fresh

    gathered, _ = two_steps(None)
    kept, fresh = two_steps(DecodeKV(runner.pool))
    assert fresh == [True, False]  # gathered once, then appended to
    for a, b in zip(gathered, kept):
        assert (a - b).abs().max() <= 1e-5

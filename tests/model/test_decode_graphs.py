"""The CUDA-graph decode step's static buffers, run eagerly on CPU: padding rows, key buckets
and masks give the same logits and K/V as the ordinary forward pass."""

from __future__ import annotations

import torch

from sgl_lite.backend.runner.decode_graphs import DecodeGraphs
from sgl_lite.backend.types import Segment
from tests.support.tiny import prefill_random, tiny_runner


def test_padded_static_buffer_step_equals_the_eager_decode():
    runner = tiny_runner()
    graphs = DecodeGraphs(runner, capture=False)
    assert graphs.buckets == (128,) and runner.pool.scratch_slot == 400
    seqs = prefill_random(runner, [5, 40, 17])  # three requests: padded to the batch-4 graph
    step = [
        Segment(token_ids=ids[-1:], start=len(ids) - 1, kv_slots=s, logits_from=0)
        for ids, s in seqs
    ]
    k_before = runner.pool.k.clone()
    eager = runner.forward(step)
    k_eager = runner.pool.k.clone()
    runner.pool.k.copy_(k_before)
    replayed = graphs.run(step)
    assert replayed is not None and replayed.ranges == eager.ranges
    assert (replayed.logits - eager.logits).abs().max() <= 1e-5
    real = torch.arange(400)
    assert torch.allclose(runner.pool.k[:, real], k_eager[:, real], atol=1e-6)


def test_passes_no_graph_fits_run_eagerly():
    runner = tiny_runner()
    graphs = DecodeGraphs(runner, capture=False)
    ((ids, slots),) = prefill_random(runner, [10])
    prefill = Segment(token_ids=ids[:3], start=0, kv_slots=slots[:3], logits_from=0)
    assert graphs.run([prefill]) is None
    long = runner.pool.alloc(129)
    too_long = Segment(token_ids=[1], start=128, kv_slots=long, logits_from=0)
    assert graphs.run([too_long]) is None
    assert graphs.run([]) is None

"""The CUDA-graph decode step's static buffers, run eagerly on CPU: padding rows, key buckets
and masks give the same logits and K/V as the ordinary forward pass."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.decode_graphs import DecodeGraphs
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models.llama import LlamaForCausalLM, head_dim_of
from sgl_lite.backend.types import Segment
from tests.conftest import TINY_LLAMA

CONFIG = LlamaConfig(**{**TINY_LLAMA, "vocab_size": 211})


def _runner() -> ModelRunner:
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(CONFIG).eval()
    model = LlamaForCausalLM(CONFIG, 128)
    model.load_hf_state_dict(hf.state_dict())
    runner = ModelRunner.__new__(ModelRunner)
    runner.model, runner.device = model.eval(), torch.device("cpu")
    runner.context_length, runner.vocab_size = 128, CONFIG.vocab_size
    runner.pool = KVPool(
        num_layers=2, num_slots=400, num_kv_heads=2, head_dim=head_dim_of(CONFIG), scratch_slots=1
    )
    return runner


def _prefill(runner: ModelRunner, lengths: list[int]) -> list[tuple[list[int], torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    seqs = []
    for n in lengths:
        ids = torch.randint(0, 211, (n + 1,), generator=gen).tolist()
        slots = runner.pool.alloc(n + 1)
        runner.forward([Segment(token_ids=ids[:n], start=0, kv_slots=slots[:n], logits_from=n)])
        seqs.append((ids, slots))
    return seqs


def test_padded_static_buffer_step_equals_the_eager_decode():
    runner = _runner()
    graphs = DecodeGraphs(runner, capture=False)
    assert graphs.buckets == (128,) and runner.pool.scratch_slot == 400
    seqs = _prefill(runner, [5, 40, 17])  # three requests: padded to the batch-4 graph
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
    runner = _runner()
    graphs = DecodeGraphs(runner, capture=False)
    ((ids, slots),) = _prefill(runner, [10])
    prefill = Segment(token_ids=ids[:3], start=0, kv_slots=slots[:3], logits_from=0)
    assert graphs.run([prefill]) is None
    long = runner.pool.alloc(129)
    too_long = Segment(token_ids=[1], start=128, kv_slots=long, logits_from=0)
    assert graphs.run([too_long]) is None
    assert graphs.run([]) is None

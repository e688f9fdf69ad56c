"""Gemma, Gemma 2 and Gemma 3 text against transformers on tiny random configs: logits of a
prefill, a chunk over a cached prefix and a mixed batch, with sliding windows shorter than the
prompt and soft caps that bite; the static-graph decode step. (Through `Engine`:
tests/tokenizer/test_gemma_engine.py.)"""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.decode_graphs import DecodeGraphs
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.gemma import GemmaForCausalLM
from sgl_lite.backend.types import Segment
from tests.support.tiny_gemma import FAMILIES, SMALL, configs, hf_model


class TinyRunner:
    """Our model plus a pool, driven by segments the way the engine drives it."""

    def __init__(self, config) -> None:
        self.hf = hf_model(config)
        self.model = GemmaForCausalLM(config, config.max_position_embeddings)
        self.model.load_hf_state_dict(self.hf.state_dict())
        self.pool = KVPool(
            num_layers=config.num_hidden_layers,
            num_slots=512,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim_of(config),
        )
        runner = ModelRunner.__new__(ModelRunner)
        runner.model, runner.pool, runner.device = self.model, self.pool, torch.device("cpu")
        self.runner = runner

    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.hf(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, seed: int, vocab: int = 211) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family):
    tiny = TinyRunner(configs(211)[family])
    ids = random_ids(40, 1)  # 5x the window
    slots = tiny.pool.alloc(len(ids))
    ours = tiny.runner.forward(
        [Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)]
    ).logits
    assert (ours - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_chunks_over_a_cached_prefix_and_a_mixed_batch_match_transformers(family):
    """A chunk over a cached prefix, a fresh prompt and two decodes, one past the window."""
    tiny = TinyRunner(configs(211)[family])
    seqs = [random_ids(n, 10 + n) for n in (30, 17, 25, 6)]
    cached = [12, 0, 24, 5]  # tokens already in the pool before the mixed pass
    all_slots = [tiny.pool.alloc(len(s)) for s in seqs]
    warmup = [
        Segment(token_ids=s[:c], start=0, kv_slots=sl[:c], logits_from=c)
        for s, c, sl in zip(seqs, cached, all_slots)
        if c
    ]
    tiny.runner.forward(warmup)
    segments = [
        Segment(token_ids=s[c:], start=c, kv_slots=sl, logits_from=0)
        for s, c, sl in zip(seqs, cached, all_slots)
    ]
    output = tiny.runner.forward(segments)
    for i, (seq, c) in enumerate(zip(seqs, cached)):
        expected = tiny.hf_logits(seq)[c:]
        assert (output.rows(i) - expected).abs().max().item() <= 1e-4, f"request {i}"


def test_the_window_and_the_soft_caps_change_the_logits():
    """The configs above exercise what they claim: without the window or caps, logits differ."""
    config = configs(211)["gemma2"]
    tiny = TinyRunner(config)
    ids = random_ids(40, 1)
    base = tiny.runner.forward(
        [Segment(token_ids=ids, start=0, kv_slots=tiny.pool.alloc(40), logits_from=0)]
    ).logits
    for change in ({"sliding_window": None}, {"softcap": None}, {"final_softcap": None}):
        model = GemmaForCausalLM(config, 256)
        model.load_hf_state_dict(tiny.hf.state_dict())
        if "sliding_window" in change:
            model.sliding_window = None
        if "softcap" in change:
            for layer in model.layers:
                layer.self_attn.softcap = None
                layer.self_attn.scale = config.query_pre_attn_scalar**-0.5
        if "final_softcap" in change:
            model.final_softcap = None
        tiny.runner.model = model
        other = tiny.runner.forward(
            [Segment(token_ids=ids, start=0, kv_slots=tiny.pool.alloc(40), logits_from=0)]
        ).logits
        assert (other - base).abs().max().item() > 1e-2, change


def test_bidirectional_attention_is_refused_naming_the_field():
    config = Gemma3TextConfig(**dict(SMALL, vocab_size=211), use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        GemmaForCausalLM(config, 64)


def test_weights_that_do_not_fit_are_a_clear_error():
    config = configs(211)["gemma3"]
    state = dict(hf_model(config).state_dict())
    state.pop("model.layers.1.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match="k_norm"):
        GemmaForCausalLM(config, 64).load_hf_state_dict(state)
    state = dict(hf_model(config).state_dict(), **{"model.extra.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="model.extra.weight"):
        GemmaForCausalLM(config, 64).load_hf_state_dict(state)


def test_gemma_decode_through_the_static_graph_buffers_equals_the_eager_step():
    """Gemma (no sliding layers) keeps CUDA-graph decoding: its step, run eagerly on the graphs'
    padded buffers, gives the ordinary forward's logits."""
    config = configs(211)["gemma"]
    tiny = TinyRunner(config)
    runner = tiny.runner
    runner.context_length, runner.vocab_size = 128, config.vocab_size
    runner.pool = KVPool(
        num_layers=config.num_hidden_layers,
        num_slots=400,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim_of(config),
        scratch_slots=1,
    )
    graphs = DecodeGraphs(runner, capture=False)
    seqs = []
    for n, seed in ((5, 1), (40, 2), (17, 3)):
        ids, slots = random_ids(n + 1, seed), runner.pool.alloc(n + 1)
        runner.forward([Segment(token_ids=ids[:n], start=0, kv_slots=slots[:n], logits_from=n)])
        seqs.append((ids, slots))
    step = [
        Segment(token_ids=ids[-1:], start=len(ids) - 1, kv_slots=s, logits_from=0)
        for ids, s in seqs
    ]
    eager = runner.forward(step)
    replayed = graphs.run(step)  # the batch-4 buffers, one padding row
    assert replayed is not None and replayed.ranges == eager.ranges
    assert (replayed.logits - eager.logits).abs().max() <= 1e-5
    expected = torch.stack([tiny.hf_logits(ids)[-1] for ids, _ in seqs])
    assert (replayed.logits - expected).abs().max() <= 1e-4

"""Our forward pass against transformers' on the same weights, tiny random configs (SmolLM2's:
tests/e2e/test_smollm_logits.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models import build_model
from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.llama import LlamaForCausalLM
from sgl_lite.backend.types import Segment

TINY = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

CONFIGS = {
    "mha_tied": LlamaConfig(
        **TINY, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True
    ),
    "gqa_untied": LlamaConfig(
        **TINY, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False
    ),
    "llama3_rope": LlamaConfig(
        **TINY,
        num_attention_heads=4,
        num_key_value_heads=1,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2_bias": Qwen2Config(
        **TINY, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False
    ),
}


class TinyRunner:
    """Our model plus a pool, driven by segments the way the engine drives it."""

    def __init__(self, config) -> None:
        torch.manual_seed(0)
        self.hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        self.model = build_model(config, config.max_position_embeddings)
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


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_logits_match_transformers(name):
    tiny = TinyRunner(CONFIGS[name])
    ids = torch.randint(0, 211, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    slots = tiny.pool.alloc(len(ids))
    ours = tiny.runner.forward(
        [Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)]
    ).logits
    assert (ours - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mixed_batch_of_chunks_and_decodes_matches_transformers(name):
    """Three requests in one pass: a chunk over a cached prefix, a fresh prompt, a decode."""
    tiny = TinyRunner(CONFIGS[name])
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 211, (n,), generator=gen).tolist() for n in (30, 17, 25)]
    cached = [12, 0, 24]  # tokens already in the pool before the mixed pass
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
        ours = output.rows(i)
        expected = tiny.hf_logits(seq)[c:]
        assert (ours - expected).abs().max().item() <= 1e-4


def test_unsupported_rope_scaling_is_a_clear_error():
    config = LlamaConfig(
        **TINY,
        num_attention_heads=4,
        num_key_value_heads=4,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    with pytest.raises(ValueError, match="rope"):
        LlamaForCausalLM(config, 64)

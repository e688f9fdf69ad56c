"""Tiny random Gemma, Gemma 2 and Gemma 3 text configs (windows of 8 tokens, soft caps low enough
to bite) and transformers' model on them: the Gemma tests' shapes, in the model and tokenizer
tiers."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, GemmaConfig

WINDOW = 8
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    # Larger than the default 0.02, so that scores and logits reach the soft caps below.
    initializer_range=0.1,
    eos_token_id=2,
    bos_token_id=1,
    pad_token_id=0,
)
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}


def configs(vocab_size: int) -> dict[str, object]:
    """One config per family; windows of 8 tokens, caps low enough to bite."""
    tiny = dict(SMALL, vocab_size=vocab_size)
    return {
        "gemma": GemmaConfig(**tiny),
        "gemma2": Gemma2Config(
            **tiny,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
        ),
        "gemma3": Gemma3TextConfig(
            **tiny,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]
            + ["sliding_attention"],
            rope_parameters={k: dict(v) for k, v in GEMMA3_ROPE.items()},
            tie_word_embeddings=False,
        ),
    }


FAMILIES = ("gemma", "gemma2", "gemma3")


def hf_model(config) -> torch.nn.Module:
    """transformers' model on fresh random weights, eager so caps and windows apply."""
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()

"""What sets one decoder family apart from plain Llama: a handful of switches, all data.

The shared decoder in `llama.py` reads these; the registry in `models/__init__.py` maps each
Hugging Face `model_type` to its spec. Sizes and constants (eps, multipliers, partial rotary
factor) come from the model's own config; the spec only says which of them apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class DecoderSpec:
    """A family's departures from Llama; the defaults are Llama (and Mistral)."""

    # q, k and v carry a bias whatever `attention_bias` says (Qwen2); o_proj follows the config.
    qkv_bias: bool = False
    # RMSNorm of q and k before RoPE: per head over head_dim (Qwen3), or over the whole
    # q / k projection (OLMo 2); None: no q/k norm.
    qk_norm: Literal["head", "projection"] | None = None
    # "pre": norm → sublayer → residual add (Llama). "post": sublayer → norm → residual add,
    # with `post_attention_layernorm` and `post_feedforward_layernorm` (OLMo 2).
    norm_placement: Literal["pre", "post"] = "pre"
    # Granite: embeddings × embedding_multiplier, each sublayer's output × residual_multiplier,
    # softmax scale = attention_multiplier, logits ÷ logits_scaling (values from the config).
    multipliers: bool = False
    # The checkpoint stores `self_attn.qkv_proj` and `mlp.gate_up_proj` already fused (Phi-3).
    fused_checkpoint: bool = False


LLAMA = DecoderSpec()

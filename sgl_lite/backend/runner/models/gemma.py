"""Gemma-family forward pass (Gemma, Gemma 2, Gemma 3 text) over the same KV pool as Llama.

The decoder is Llama's (`models/llama.py`: fused projections, pool reads and writes, one
attention call per group of requests) with Gemma's parts swapped in:

- embeddings scaled by sqrt(hidden), rounded to the activation dtype as transformers does;
- RMSNorm computed in float32 with weight `(1 + w)`;
- Gemma 2/3: a norm after attention and around the feed-forward ("sandwich" blocks);
- GELU-tanh feed-forward; softmax scale `query_pre_attn_scalar ** -0.5`;
- Gemma 2: attention scores and final logits soft-capped by `tanh(x / cap) * cap`;
- Gemma 3: RMSNorm over each q and k head, before RoPE;
- Gemma 2/3: sliding-window layers (`layer_types`) interleaved with global ones, Gemma 3 with
  their own RoPE base (`rope_local_base_freq`).

NOTE: sliding layers keep every key in the pool and bound what they see by a mask (the runner's
`AttentionGroup.window_mask`), so the radix cache shares prefixes exactly as for Llama.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn
from transformers import PretrainedConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.models.attention import Attention, head_dim_of
from sgl_lite.backend.runner.models.llama import MLP, LlamaForCausalLM
from sgl_lite.backend.runner.models.metadata import AttentionMetadata
from sgl_lite.backend.runner.models.rope import RotaryEmbedding, apply_rope
from sgl_lite.backend.runner.models.spec import LLAMA, DecoderSpec
from sgl_lite.backend.runner.weights.linear import Linear

GEMMA_MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
SLIDING = "sliding_attention"
GLOBAL = "full_attention"


def layer_types(config: PretrainedConfig) -> list[str]:
    """Each layer's attention kind: `sliding_attention` or `full_attention`."""
    types = getattr(config, "layer_types", None) or [GLOBAL] * config.num_hidden_layers
    unknown = sorted(set(types) - {SLIDING, GLOBAL})
    if unknown or len(types) != config.num_hidden_layers:
        raise ValueError(
            f"config field layer_types must list {config.num_hidden_layers} entries of "
            f"{SLIDING!r} or {GLOBAL!r}, got {list(types)}"
        )
    return list(types)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm over the last axis: float32 math, weight applied as (1 + w)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def rope_config(config: PretrainedConfig, layer_type: str) -> PretrainedConfig:
    """The config as `RotaryEmbedding` reads it for one layer type.

    Gemma 3 nests its RoPE settings by layer type (a local base for sliding layers, rope_theta
    and rope_scaling for global ones); Gemma and Gemma 2 have one set for all layers.
    """
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type not in params:
        return config
    flat = copy.copy(config)
    flat.rope_parameters = dict(params[layer_type])
    return flat


class GemmaAttention(Attention):
    """Llama's pool attention with Gemma's scale, optional q/k norms and score soft-capping."""

    def __init__(self, config: PretrainedConfig, layer_id: int) -> None:
        super().__init__(config, layer_id)
        self.eps = config.rms_norm_eps
        scalar = getattr(config, "query_pre_attn_scalar", None) or self.head_dim
        self.scale = float(scalar) ** -0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self.plain_softmax = self.softcap is None  # `_core`'s soft-capping: no shortcut
        if getattr(config, "attention_bias", False):  # Gemma's o_proj shares the q/k/v bias flag
            self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=True)
        self.qk_norm = "head" if config.model_type == "gemma3_text" else None  # Gemma 3's (1+w)
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.zeros(self.head_dim))
            self.k_norm = nn.Parameter(torch.zeros(self.head_dim))

    def forward(
        self, x: torch.Tensor, meta: AttentionMetadata, pool: KVPool, cast_back: bool = True
    ) -> torch.Tensor:
        """x: (T, hidden) → (T, hidden); `meta` carries this layer's RoPE tables and masks,
        `cast_back` as in `Linear.run`, for o_proj."""
        T, heads, qk_heads = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj.run(x, meta.use_int).view(T, qk_heads + self.num_kv_heads, -1)
        qk = qkv[:, :qk_heads]  # (T, H + Hkv, D)
        if self.qk_norm:
            qk = torch.cat(
                (
                    gemma_rms_norm(qk[:, :heads], self.q_norm, self.eps),
                    gemma_rms_norm(qk[:, heads:], self.k_norm, self.eps),
                ),
                dim=1,
            )
        qk = apply_rope(qk, meta.cos, meta.sin)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, qk_heads:]
        return self.attend_and_project(q, k, v, meta, pool, cast_back)

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention of (B, Hkv, G*Q, D) queries; soft-capped scores need the explicit path."""
        if self.softcap is None:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scale
            )
        assert self.scale is not None  # always set by __init__ for Gemma
        scores = (q @ k.transpose(-1, -2)) * self.scale  # (B, Hkv, G*Q, K)
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is not None:  # (B, 1, G*Q, K): the same for every KV head
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ v


class GemmaMLP(MLP):
    """down(act(gate(x)) * up(x)) with the config's activation (GELU-tanh in every release)."""

    ACTIVATIONS = ()  # any of transformers' activations, by the config's name

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        # Imported here: transformers.activations pulls in its kernel hub and torch.distributed
        # (~1 s of every load, Gemma or not).
        from transformers.activations import ACT2FN

        name = getattr(config, "hidden_activation", None) or config.hidden_act
        self.act = ACT2FN[name]

    def forward(
        self, x: torch.Tensor, use_int: bool = False, cast_back: bool = True
    ) -> torch.Tensor:
        """x: (T, hidden) → (T, hidden); `cast_back` as in `Linear.run`, for down_proj."""
        gate, up = self.gate_up_proj.run(x, use_int).split(self.intermediate, dim=-1)
        return self.down_proj.run(self.act(gate) * up, use_int, cast_back)


class GemmaDecoderLayer(nn.Module):
    """Gemma's block: Llama's pre-norm block, with Gemma 2/3's norms after each sub-block."""

    def __init__(self, config: PretrainedConfig, layer_id: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.sliding = layer_types(config)[layer_id] == SLIDING
        self.sandwich = config.model_type != "gemma"
        self.input_layernorm = nn.Parameter(torch.zeros(hidden))
        self.post_attention_layernorm = nn.Parameter(torch.zeros(hidden))
        if self.sandwich:
            self.pre_feedforward_layernorm = nn.Parameter(torch.zeros(hidden))
            self.post_feedforward_layernorm = nn.Parameter(torch.zeros(hidden))
        self.self_attn = GemmaAttention(config, layer_id)
        self.mlp = GemmaMLP(config)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, pool: KVPool) -> torch.Tensor:
        """x: (T, hidden) → (T, hidden)."""
        norm, use_int = self._norm, meta.use_int
        h = self.self_attn.forward(norm(x, self.input_layernorm), meta, pool)
        if not self.sandwich:  # Gemma 1: Llama's block
            x = x + h
            return x + self.mlp.forward(norm(x, self.post_attention_layernorm), use_int)
        x = x + norm(h, self.post_attention_layernorm)
        h = self.mlp.forward(norm(x, self.pre_feedforward_layernorm), use_int)
        return x + norm(h, self.post_feedforward_layernorm)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, weight, self.eps)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma, Gemma 2 and Gemma 3 text: Llama's model with Gemma's layers, norms and RoPE."""

    # Windows are per layer, in the masks: the runner must not bound the context by them.
    sliding_window_in_mask = True

    def __init__(
        self, config: PretrainedConfig, max_positions: int, spec: DecoderSpec = LLAMA
    ) -> None:
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("config field use_bidirectional_attention=True is not supported")
        # Llama's embeddings, final norm and head with Gemma's layers; RoPE is replaced below.
        super().__init__(config, max_positions, spec)
        self.norm = nn.Parameter(torch.zeros(config.hidden_size))
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        types = layer_types(config)
        self.sliding_window: int | None = config.sliding_window if SLIDING in types else None
        head_dim = head_dim_of(config)
        # Computed, not loaded: real tensors even when the runner builds the model on `meta`.
        with torch.device("cpu"):
            self.rope = RotaryEmbedding(rope_config(config, GLOBAL), head_dim, max_positions)
            local = rope_config(config, SLIDING)
            self.rope_local = (
                RotaryEmbedding(local, head_dim, max_positions) if local is not config else None
            )
            # sqrt(hidden), cast to the weights' dtype with them as transformers rounds it.
            self.register_buffer(
                "embed_scale", torch.tensor(config.hidden_size**0.5), persistent=False
            )

    def make_layer(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec) -> nn.Module:
        """Gemma's own block (its norms, GELU MLP and soft-capped attention)."""
        return GemmaDecoderLayer(config, layer_id)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, pool: KVPool
    ) -> torch.Tensor:
        """input_ids: (T,) → final hidden states (T, hidden); each token's K/V goes to the pool."""
        x = self.embed_tokens(input_ids)
        x = x * self.embed_scale.to(x.dtype)
        local = self._sliding_metadata(meta)
        for layer in self.layers:
            x = layer.forward(x, local if layer.sliding else meta, pool)
        return gemma_rms_norm(x, self.norm, self.config.rms_norm_eps)

    def _sliding_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        """The metadata sliding layers read: windowed masks and, in Gemma 3, local RoPE tables."""
        if self.sliding_window is None:
            return meta
        cos, sin = meta.cos, meta.sin
        if self.rope_local is not None:
            cos, sin = self.rope_local.tables(meta.positions, meta.cos.dtype)
        groups = tuple(
            g if g.window_mask is None else replace(g, mask=g.window_mask) for g in meta.groups
        )
        return replace(meta, cos=cos, sin=sin, groups=groups)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, use_int: bool = False) -> torch.Tensor:
        """hidden: (N, hidden) → float32 logits (N, vocab), soft-capped where configured."""
        logits = super().compute_logits(hidden, use_int)
        if self.final_softcap is None:
            return logits
        return torch.tanh(logits / self.final_softcap) * self.final_softcap

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads weights named as in transformers, fusing q/k/v and gate/up as it goes."""
        own: dict[str, torch.Tensor] = {}
        used: set[str] = set()

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise ValueError(f"weights do not fit the model: missing tensor {name!r}")
            used.add(name)
            return state[name]

        for i, layer in enumerate(self.layers):
            p, o = f"model.layers.{i}.", f"layers.{i}."
            attn = p + "self_attn."
            own[o + "self_attn.qkv_proj.weight"] = torch.cat(
                [take(attn + f"{n}_proj.weight") for n in "qkv"]
            )
            if attn + "q_proj.bias" in state:
                own[o + "self_attn.qkv_proj.bias"] = torch.cat(
                    [take(attn + f"{n}_proj.bias") for n in "qkv"]
                )
            own[o + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
            if attn + "o_proj.bias" in state:
                own[o + "self_attn.o_proj.bias"] = take(attn + "o_proj.bias")
            if self.config.model_type == "gemma3_text":  # q/k norms (GemmaAttention.qk_norm)
                own[o + "self_attn.q_norm"] = take(attn + "q_norm.weight")
                own[o + "self_attn.k_norm"] = take(attn + "k_norm.weight")
            own[o + "mlp.gate_up_proj.weight"] = torch.cat(
                [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]
            )
            own[o + "mlp.down_proj.weight"] = take(p + "mlp.down_proj.weight")
            norms = ["input_layernorm", "post_attention_layernorm"]
            if layer.sandwich:
                norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
            for norm in norms:
                own[o + norm] = take(p + norm + ".weight")
        own["embed_tokens.weight"] = take("model.embed_tokens.weight")
        own["norm"] = take("model.norm.weight")
        if not self.tied:
            own["lm_head.weight"] = take("lm_head.weight")
        used.add("lm_head.weight")  # a tied head may still be listed
        unexpected = sorted(set(state) - used)
        missing, extra = self.load_state_dict(own, strict=False, assign=True)
        if unexpected or extra or missing:
            raise ValueError(
                f"weights do not fit the model: missing {missing}, unexpected {unexpected + extra}"
            )

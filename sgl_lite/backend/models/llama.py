"""Llama-family forward pass (Llama, Mistral, Qwen2) in plain torch over the token-slot KV pool.

One call serves a mixed batch: prefill chunks of several requests, each attending to its cached
prefix plus itself causally, and single decode tokens. Tokens of all requests are flattened to
one (T, hidden) matrix for every projection; only attention regroups them per request, gathering
each request's K/V from the pool by slot id. The model never sees requests, only tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sgl_lite.backend.decode_kv import KVView
from sgl_lite.backend.kv_pool import KVPool
from sgl_lite.backend.weights.linear import Linear
from sgl_lite.backend.weights.quant import PackedWeight

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, kw_only=True)
class AttentionGroup:
    """Requests whose queries are padded together for one attention call.

    B = requests in the group, Q = most new tokens of one of them, K = longest whole sequence
    (cached prefix + new tokens). Decodes (Q = 1) and prefill chunks form separate groups, so a
    long chunk never pads every decode row to its length.
    """

    q_index: torch.Tensor  # (B, Q) row of each query in the flat token matrix; padding → row 0
    q_flat: torch.Tensor  # (T_g,) row of each real query in the (B * Q) padded layout
    rows: torch.Tensor  # (T_g,) the same queries' rows in the flat token matrix
    kv_slots: torch.Tensor  # (B, K) pool slots of each request's whole sequence; padding → 0
    kv_flat: torch.Tensor  # (B * K,) the same, flattened for index_select
    # (B, 1, G * Q, K) True where the query may attend to the key, rows repeated for the G query
    # heads sharing a KV head; None when every query sees every key (one decode request)
    mask: torch.Tensor | None
    # The same for sliding-window layers (a query at p sees keys in (p - window, p]); None when
    # the model has no sliding layers or no key of the group falls out of the window
    window_mask: torch.Tensor | None = None
    rows_in_order: bool = False  # q_index is arange(B)[:, None]: queries need no gather
    kv_view: KVView | None = None  # decode steps: K/V kept gathered between steps (decode_kv)


@dataclass(frozen=True, kw_only=True)
class AttentionMetadata:
    """Where every token of a batch sits, built once per forward and shared by all layers.

    T = new tokens in the batch, flattened over all requests in order.
    """

    positions: torch.Tensor  # (T,) absolute position of each new token
    cos: torch.Tensor  # (T, 1, D) RoPE tables at those positions, looked up once for all layers
    sin: torch.Tensor  # (T, 1, D)
    out_slots: torch.Tensor  # (T,) pool slot that receives each new token's K/V
    groups: tuple[AttentionGroup, ...]
    use_int: bool = False  # small pass: linears run their packed int kernels where they have one


def rope_parameters(config: PretrainedConfig) -> dict:
    """The config's RoPE settings, whichever name this transformers version gives them."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for every position up to the context length."""

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        rope_type = rope_parameters(config)["rope_type"]
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_scaling type {rope_type!r}; supported: "
                f"{', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if rope_type == "default":
            theta = rope_parameters(config)["rope_theta"]
            inv_freq = 1.0 / (
                theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
            )
            scaling = 1.0
        else:  # the scaled variants exactly as transformers defines them
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.float())  # (P, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (P, D)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        # The first half negated: rotate_half(x) * sin == roll(x, D/2) * sin_signed (exact).
        sin = freqs.sin() * scaling
        self.register_buffer("sin", torch.cat((-sin, sin), dim=-1), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, signed sin (T, 1, D) at the given positions (T,), for `apply_rope`."""
        return (
            self.cos.index_select(0, positions).unsqueeze(1).to(dtype),
            self.sin.index_select(0, positions).unsqueeze(1).to(dtype),
        )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x (T, heads, D) by its positions' cos and signed sin tables (T, 1, D).

    Equal to transformers' x * cos + rotate_half(x) * sin, in four ops instead of seven.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table (N, ...) gathered by index (B, K) → (B, K, ...).

    NOTE: index_select, not table[index]: on CPU advanced indexing into a large table (the KV
    pool) costs milliseconds where index_select costs microseconds.
    """
    return table.index_select(0, index.flatten()).view(*index.shape, *table.shape[1:])


class Attention(nn.Module):
    """Grouped-query attention reading and writing K/V in the pool by slot id."""

    # Set by the runner in the int modes (float64): the dtype SDPA computes in, so a query's
    # result rounds the same whatever the pass's padding and query count (weights/formats).
    attn_dtype: torch.dtype | None = None

    def __init__(self, config: PretrainedConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        # q, k and v share one matmul: three small GEMMs cost more than one on CPU.
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, pool: KVPool) -> torch.Tensor:
        """x: (T, hidden) → (T, hidden)."""
        T, heads, qk_heads = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj.run(x, meta.use_int).view(T, qk_heads + self.num_kv_heads, -1)
        # q and k heads are adjacent in the fused output: one RoPE call rotates both.
        qk = apply_rope(qkv[:, :qk_heads], meta.cos, meta.sin)  # (T, H + Hkv, D)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, qk_heads:]
        pool.write(self.layer_id, meta.out_slots, k, v)

        if len(meta.groups) == 1:  # the common case: the group's rows are all rows, in order
            out = self._attend(q, meta.groups[0], pool, k, v)
        else:
            out = q.new_empty(T, self.num_heads, self.head_dim)
            for group in meta.groups:
                out.index_copy_(0, group.rows, self._attend(q, group, pool))
        return self.o_proj.run(out.reshape(T, -1), meta.use_int)

    def _attend(
        self,
        q: torch.Tensor,
        group: AttentionGroup,
        pool: KVPool,
        k_new: torch.Tensor | None = None,
        v_new: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of one group's queries over their sequences → (T_g, H, D).

        The G query heads that share a KV head are folded into the query-length axis, so SDPA
        runs plain multi-head attention over the un-expanded K/V: exact, no K/V copy, and it
        keeps the fast kernel (`enable_gqa` with a mask falls to a slow path, ~100x at batch 1).
        """
        batch, max_q = group.q_index.shape
        kv_heads, dim = self.num_kv_heads, self.head_dim
        per_kv = self.num_heads // kv_heads
        if group.rows_in_order:  # one decode per request, the batch's only group
            q_batched = q.view(batch, max_q, self.num_heads, dim)
        else:
            q_batched = gather_rows(q, group.q_index)  # (B, Q, H, D)
        q_batched = q_batched.view(batch, max_q, kv_heads, per_kv, dim).permute(0, 2, 3, 1, 4)
        q_batched = q_batched.reshape(batch, kv_heads, per_kv * max_q, dim)  # (B, Hkv, G*Q, D)
        k_batched, v_batched = self._keys_values(group, pool, k_new, v_new)  # (B, Hkv, K, D)
        if self.attn_dtype is not None:  # a no-op for decode copies already kept in it
            k_batched, v_batched = k_batched.to(self.attn_dtype), v_batched.to(self.attn_dtype)
        out = self._core(q_batched.to(k_batched.dtype), k_batched, v_batched, group.mask)
        out = out.view(batch, kv_heads, per_kv, max_q, dim).permute(0, 3, 1, 2, 4)
        out = out.reshape(batch * max_q, self.num_heads, dim)  # (B * Q, H, D)
        if max_q == 1:  # decodes: every padded row is a real query, already in order
            return out.to(q.dtype)
        return out.index_select(0, group.q_flat).to(q.dtype)  # (T_g, H, D)

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(D)) v over (B, Hkv, G*Q, D) queries → (B, Hkv, G*Q, D)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def _keys_values(
        self,
        group: AttentionGroup,
        pool: KVPool,
        k_new: torch.Tensor | None,
        v_new: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's K and V (B, Hkv, K, D): gathered from the pool, or from the decode copies."""
        batch, max_k = group.kv_slots.shape
        shape = (batch, max_k, self.num_kv_heads, self.head_dim)
        view = group.kv_view
        layer = self.layer_id
        if view is None or k_new is None:
            keys = pool.k_layers[layer].index_select(0, group.kv_flat).view(shape)
            values = pool.v_layers[layer].index_select(0, group.kv_flat).view(shape)
            return keys.transpose(1, 2), values.transpose(1, 2)
        full = (batch, view.capacity, self.num_kv_heads, self.head_dim)
        keys, values = view.k[layer].view(full), view.v[layer].view(full)
        if view.fresh:
            keys[:, :max_k] = pool.k_layers[layer].index_select(0, group.kv_flat).view(shape)
            values[:, :max_k] = pool.v_layers[layer].index_select(0, group.kv_flat).view(shape)
        else:  # the previous step's rows plus this step's token, which the pool has too
            view.k[layer].index_copy_(0, view.new_index, k_new.to(keys.dtype))
            view.v[layer].index_copy_(0, view.new_index, v_new.to(values.dtype))
        return keys[:, :max_k].transpose(1, 2), values[:, :max_k].transpose(1, 2)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, bias=False)
        self.down_proj = Linear(self.intermediate, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, use_int: bool = False) -> torch.Tensor:
        gate, up = self.gate_up_proj.run(x, use_int).split(self.intermediate, dim=-1)
        return self.down_proj.run(F.silu(gate) * up, use_int)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config: PretrainedConfig, layer_id: int) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = nn.Parameter(torch.ones(config.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(config.hidden_size))
        self.self_attn = Attention(config, layer_id)
        self.mlp = MLP(config)

    def forward(self, x, meta, pool):
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        x = x + self.self_attn.forward(h, meta, pool)  # .forward: no hook machinery per call
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp.forward(h, meta.use_int)


def head_dim_of(config: PretrainedConfig) -> int:
    """Per-head width: explicit in newer configs, hidden/heads otherwise."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaForCausalLM(nn.Module):
    """The whole model: embeddings, decoder layers, final norm, LM head (tied or not)."""

    def __init__(self, config: PretrainedConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (
            None if self.tied else Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rope = RotaryEmbedding(config, head_dim_of(config), max_positions)
        # A packed int8 copy of the LM head, for the int modes' passes (set by the runner).
        self.head_packed: PackedWeight | None = None

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, pool: KVPool
    ) -> torch.Tensor:
        """input_ids: (T,) → final hidden states (T, hidden); each token's K/V goes to the pool."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer.forward(x, meta, pool)
        return F.rms_norm(x, x.shape[-1:], self.norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, use_int: bool = False) -> torch.Tensor:
        """hidden: (N, hidden) → float32 logits (N, vocab); `head_packed` in the int modes."""
        if self.head_packed is not None and use_int:
            return self.head_packed.matmul(hidden.to(torch.bfloat16)).float()
        weight = self.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads weights named as in transformers, fusing q/k/v and gate/up as it goes."""
        own = {}
        for i in range(self.config.num_hidden_layers):
            p = f"model.layers.{i}."
            own[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(
                [state[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            )
            if p + "self_attn.q_proj.bias" in state:
                own[f"layers.{i}.self_attn.qkv_proj.bias"] = torch.cat(
                    [state[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]
                )
            own[f"layers.{i}.self_attn.o_proj.weight"] = state[p + "self_attn.o_proj.weight"]
            own[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(
                [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
            )
            own[f"layers.{i}.mlp.down_proj.weight"] = state[p + "mlp.down_proj.weight"]
            own[f"layers.{i}.input_layernorm"] = state[p + "input_layernorm.weight"]
            own[f"layers.{i}.post_attention_layernorm"] = state[
                p + "post_attention_layernorm.weight"
            ]
        own["embed_tokens.weight"] = state["model.embed_tokens.weight"]
        own["norm"] = state["model.norm.weight"]
        if not self.tied:
            own["lm_head.weight"] = state.get("lm_head.weight", state["model.embed_tokens.weight"])
        missing, unexpected = self.load_state_dict(own, strict=False, assign=True)
        missing = [m for m in missing if not m.startswith("rope.")]
        if missing or unexpected:
            raise ValueError(
                f"weights do not fit the model: missing {missing}, unexpected {unexpected}"
            )

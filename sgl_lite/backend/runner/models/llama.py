"""The shared decoder forward pass in plain torch over the token-slot KV pool.

Llama, Mistral and Qwen2 run it as it is; Qwen3, OLMo 2, Granite and Phi-3 differ from it only
by the switches of their `DecoderSpec` (spec.py; the registry is `models/__init__.py`).

One call serves a mixed batch: prefill chunks of several requests, each attending to its cached
prefix plus itself causally, and single decode tokens. Tokens of all requests are flattened to
one (T, hidden) matrix for every projection; only attention regroups them per request, gathering
each request's K/V from the pool by slot id. The model never sees requests, only tensors.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.models.checkpoint import ModelLoadError, WeightSource, load_checked
from sgl_lite.backend.runner.models.metadata import AttentionGroup, AttentionMetadata
from sgl_lite.backend.runner.models.rope import (
    RotaryEmbedding,
    apply_partial_rope,
    apply_rope,
    rotary_dim_of,
)
from sgl_lite.backend.runner.models.shared_prefix import attend_shared
from sgl_lite.backend.runner.models.spec import LLAMA, DecoderSpec
from sgl_lite.backend.runner.weights import onednn
from sgl_lite.backend.runner.weights.embedding import FileEmbedding
from sgl_lite.backend.runner.weights.linear import Linear, dense_linear
from sgl_lite.backend.runner.weights.quant import PackedWeight


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
    # Whether `_core` is plain softmax attention, so the shortcuts that compute it another way
    # apply: decode steps over the copies' whole capacity (`capacity_bias`), and SDPA's own
    # causal masking for groups that start their sequences (`AttentionGroup.causal`). False
    # where `_core` computes something else (Gemma's soft-capping).
    plain_softmax = True

    def __init__(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec = LLAMA) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        bias = bool(getattr(config, "attention_bias", False))
        # q, k and v share one matmul: three small GEMMs cost more than one on CPU.
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=bias or spec.qkv_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=bias)
        # None: SDPA's own 1/sqrt(head_dim); Granite sets its attention_multiplier.
        self.scale = float(config.attention_multiplier) if spec.multipliers else None
        partial = rotary_dim_of(config, self.head_dim) < self.head_dim
        self.rope = apply_partial_rope if partial else apply_rope
        self.qk_norm = spec.qk_norm
        if spec.qk_norm is not None:
            self.eps = config.rms_norm_eps
            per_head = spec.qk_norm == "head"
            self.q_norm = nn.Parameter(torch.ones(self.head_dim if per_head else q_size))
            self.k_norm = nn.Parameter(torch.ones(self.head_dim if per_head else kv_size))

    def forward(
        self, x: torch.Tensor, meta: AttentionMetadata, pool: KVPool, cast_back: bool = True
    ) -> torch.Tensor:
        """x: (T, hidden) → (T, hidden); `cast_back` as in `Linear.run`, for o_proj."""
        T, heads, qk_heads = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        # The int path's bf16 output goes to RoPE as it is: its float32 tables promote it.
        plain = self.qk_norm is None
        flat = self.qkv_proj.run(x, meta.use_int, cast_back=not plain)  # (T, (H + 2Hkv) * D)
        qkv = flat.view(T, qk_heads + self.num_kv_heads, -1)  # (T, H + 2 * Hkv, D)
        # q and k heads are adjacent in the fused output: one RoPE call rotates both.
        qk = qkv[:, :qk_heads] if plain else self._normed_qk(flat)
        qk = self.rope(qk, meta.cos, meta.sin)  # (T, H + Hkv, D)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, qk_heads:]
        return self.attend_and_project(q, k, v, meta, pool, cast_back)

    def attend_and_project(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        pool: KVPool,
        cast_back: bool = True,
    ) -> torch.Tensor:
        """Writes the new K/V (T, Hkv, D) to the pool, attends every group's queries (T, H, D)
        over their sequences and applies o_proj → (T, hidden)."""
        pool.write(self.layer_id, meta.out_slots, k, v)
        if len(meta.groups) == 1:  # the common case: the group's rows are all rows, in order
            out = self._attend(q, meta.groups[0], pool, k, v)
        else:
            out = q.new_empty(q.shape[0], self.num_heads, self.head_dim)
            for group in meta.groups:
                out.index_copy_(0, group.rows, self._attend(q, group, pool))
        return self.o_proj.run(out.reshape(q.shape[0], -1), meta.use_int, cast_back)

    def _normed_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """q and k of the fused projection (T, (H + 2 * Hkv) * D), RMS-normed → (T, H + Hkv, D)."""
        T, D = qkv.shape[0], self.head_dim
        q_size, kv_size, _ = self.split_sizes
        q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
        if self.qk_norm == "head":  # Qwen3: each head normed on its own
            q = F.rms_norm(q.view(T, self.num_heads, D), (D,), self.q_norm, self.eps)
            k = F.rms_norm(k.view(T, self.num_kv_heads, D), (D,), self.k_norm, self.eps)
        else:  # OLMo 2: the whole q (and k) projection normed at once, before the head split
            q = F.rms_norm(q, (q_size,), self.q_norm, self.eps).view(T, self.num_heads, D)
            k = F.rms_norm(k, (kv_size,), self.k_norm, self.eps).view(T, self.num_kv_heads, D)
        return torch.cat((q, k), dim=1)  # (T, H + Hkv, D)

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
        if group.causal and self.plain_softmax and self.attn_dtype is None:
            return self._attend_causal(q_batched, group, pool, k_new, v_new).to(q.dtype)
        q_batched = q_batched.view(batch, max_q, kv_heads, per_kv, dim).permute(0, 2, 3, 1, 4)
        q_batched = q_batched.reshape(batch, kv_heads, per_kv * max_q, dim)  # (B, Hkv, G*Q, D)
        if group.shared is not None:  # decodes sharing cached prefixes: each read once
            layer_k, layer_v = pool.k_layers[self.layer_id], pool.v_layers[self.layer_id]
            out = attend_shared(q_batched, layer_k, layer_v, group.shared, self.scale)
        elif group.capacity_bias is not None and self.plain_softmax and k_new is not None:
            self._keys_values(group, pool, k_new, v_new)  # brings the copies up to this step
            assert group.kv_view is not None  # capacity_bias is set only beside the copies
            keys, values = group.kv_view.k[self.layer_id], group.kv_view.v[self.layer_id]
            out = self._decode_over_copies(q_batched.to(keys.dtype), keys, values, group)
        else:
            k_batched, v_batched = self._keys_values(group, pool, k_new, v_new)  # (B, Hkv, K, D)
            # Casts only where the dtype differs: decode copies are kept in attn_dtype already,
            # and a no-op `.to` still costs a dispatch (~60 per step).
            attn = self.attn_dtype or k_batched.dtype
            if k_batched.dtype is not attn:
                k_batched, v_batched = k_batched.to(attn), v_batched.to(attn)
            if q_batched.dtype is not attn:
                q_batched = q_batched.to(attn)
            out = self._core(q_batched, k_batched, v_batched, group.mask)
        out = out.view(batch, kv_heads, per_kv, max_q, dim).permute(0, 3, 1, 2, 4)
        out = out.reshape(batch * max_q, self.num_heads, dim)  # (B * Q, H, D)
        if max_q == 1:  # decodes: every padded row is a real query, already in order
            return out.to(q.dtype)
        return out.index_select(0, group.q_flat).to(q.dtype)  # (T_g, H, D)

    def _attend_causal(
        self,
        q: torch.Tensor,
        group: AttentionGroup,
        pool: KVPool,
        k_new: torch.Tensor | None,
        v_new: torch.Tensor | None,
    ) -> torch.Tensor:
        """Queries (B, Q, H, D) that start their sequences (`group.causal`) → (T_g, H, D): SDPA
        with its own causal masking over the query heads as they are (`enable_gqa`), no mask.

        Only the fast mode takes it (the int modes' float64 attention keeps one path for every
        pass). Against the folded layout with the group's boolean mask, SDPA's CPU flash kernel
        skips the blocks above the diagonal and converts no mask in every layer: a 1,504-token
        prefill's attention 14.4 -> 6.3 ms a layer (SmolLM2's heads, bf16, 2 threads), its
        outputs equal bit for bit in bf16 on the shapes tried (tests/model/test_causal_prefill).
        A padded query row past its request's tokens sees keys up to its own index; its output
        is dropped by `q_flat`, and a real row never sees a key past its own.
        """
        keys, values = self._keys_values(group, pool, k_new, v_new)  # (B, Hkv, K = Q, D)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2).to(keys.dtype),
            keys,
            values,
            is_causal=True,
            scale=self.scale,
            enable_gqa=True,
        )  # (B, H, Q, D)
        batch, heads, max_q, dim = out.shape
        out = out.transpose(1, 2).reshape(batch * max_q, heads, dim)
        return out if batch == 1 else out.index_select(0, group.q_flat)

    def _decode_over_copies(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: AttentionGroup
    ) -> torch.Tensor:
        """Decode queries (B, Hkv, G, D) over the decode copies' whole capacity (B, Hkv, C, D)
        → (B, Hkv, G, D): two batched matmuls and a float32 softmax, the positions past each
        row's keys masked by `group.capacity_bias`.

        Each row's copy is a contiguous (C, D) block only over the whole capacity; over a
        shorter slice the batched matmul first copies K and V. For decode-shaped queries (G
        rows per KV head) this beats SDPA's flash kernel from 8 rows on (8 rows x 1,000 keys:
        a step 53 -> 43 ms, SmolLM2, 2 threads). The scores round to bf16 before the softmax
        (SDPA's stay float32): the fast mode's bounds hold, at 8 rows the embedded model's
        perplexity goes from 1.0013 to 1.0032 of float32's (tests/e2e/test_smollm_logits.py).
        """
        assert group.capacity_bias is not None
        scale = self.scale if self.scale is not None else self.head_dim**-0.5
        scores = torch.matmul(q, keys.transpose(-1, -2)).float()  # (B, Hkv, G, C)
        scores = scores.mul_(scale).add_(group.capacity_bias)
        return torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(q k^T * scale) v over (B, Hkv, G*Q, D) queries → (B, Hkv, G*Q, D)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

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
        if view is None or k_new is None or v_new is None:  # the decode path passes both
            keys = pool.k_layers[layer].index_select(0, group.kv_flat).view(shape)
            values = pool.v_layers[layer].index_select(0, group.kv_flat).view(shape)
            return keys.transpose(1, 2), values.transpose(1, 2)
        keys, values = view.k[layer], view.v[layer]  # (B, Hkv, capacity, D)
        if view.fresh:
            gathered = pool.k_layers[layer].index_select(0, group.kv_flat).view(shape)
            keys[:, :, :max_k] = gathered.transpose(1, 2)
            gathered = pool.v_layers[layer].index_select(0, group.kv_flat).view(shape)
            values[:, :, :max_k] = gathered.transpose(1, 2)
            if group.capacity_bias is not None:
                # What an earlier batch left past the rows: `_decode_over_copies` reads it
                # (masked), and a masked NaN would still reach the output through softmax @ V.
                keys[:, :, max_k:] = 0
                values[:, :, max_k:] = 0
        else:  # the previous step's rows plus this step's token, which the pool has too
            rows = (-1, self.head_dim)
            keys.view(rows).index_copy_(0, view.new_index, k_new.reshape(rows).to(keys.dtype))
            values.view(rows).index_copy_(0, view.new_index, v_new.reshape(rows).to(values.dtype))
        return keys[:, :, :max_k], values[:, :, :max_k]


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    ACTIVATIONS: tuple[str, ...] = ("silu", "swish")  # what `forward` computes; () = any

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if self.ACTIVATIONS and act not in self.ACTIVATIONS:
            raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported; use silu")
        bias = bool(getattr(config, "mlp_bias", False))
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, bias=bias)
        self.down_proj = Linear(self.intermediate, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, use_int: bool = False, cast_back: bool = True):
        """x: (T, hidden) → (T, hidden); `cast_back` as in `Linear.run`, for down_proj."""
        fused = self.gate_up_proj.run(x, use_int, cast_back=False)
        gate, up = fused.split(self.intermediate, dim=-1)
        # silu in the activation dtype; the product promotes `up` (the same bits as a cast).
        act = F.silu(gate if gate.dtype == x.dtype else gate.to(x.dtype)) * up
        return self.down_proj.run(act, use_int, cast_back)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block (Llama, Qwen, Phi-3)."""

    norm_names = ("input_layernorm", "post_attention_layernorm")  # as in the checkpoint
    # Set by name in __init__ (the norms differ by block); declared for the type checker.
    input_layernorm: nn.Parameter
    post_attention_layernorm: nn.Parameter

    def __init__(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec = LLAMA) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        for name in self.norm_names:
            setattr(self, name, nn.Parameter(torch.ones(config.hidden_size)))
        self.self_attn = Attention(config, layer_id, spec)
        self.mlp = MLP(config)

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden); this layer's K/V go to the pool."""
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        # .forward: no hook machinery per call. The sublayers' int-path outputs stay bf16: the
        # residual add widens them (cast_back=False saves a cast per sublayer).
        x = x + self.self_attn.forward(h, meta, pool, cast_back=False)
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp.forward(h, meta.use_int, cast_back=False)


class ScaledResidualLayer(DecoderLayer):
    """Pre-norm block whose sublayer outputs are scaled before the residual add (Granite)."""

    def __init__(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec = LLAMA) -> None:
        super().__init__(config, layer_id, spec)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden)."""
        m = self.residual_multiplier
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        x = x + self.self_attn.forward(h, meta, pool) * m
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp.forward(h, meta.use_int) * m


class PostNormDecoderLayer(DecoderLayer):
    """Block that norms each sublayer's output instead of its input (OLMo 2)."""

    norm_names = ("post_attention_layernorm", "post_feedforward_layernorm")
    post_feedforward_layernorm: nn.Parameter

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden)."""
        h = self.self_attn.forward(x, meta, pool)
        x = x + F.rms_norm(h, h.shape[-1:], self.post_attention_layernorm, self.eps)
        h = self.mlp.forward(x, meta.use_int)
        return x + F.rms_norm(h, h.shape[-1:], self.post_feedforward_layernorm, self.eps)


def layer_class(spec: DecoderSpec) -> type[DecoderLayer]:
    """The block a spec calls for; plain Llama's does no work beyond Llama's."""
    if spec.norm_placement == "post":
        return PostNormDecoderLayer
    return ScaledResidualLayer if spec.multipliers else DecoderLayer


def head_dim_of(config: PretrainedConfig) -> int:
    """Per-head width: explicit in newer configs, hidden/heads otherwise."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaForCausalLM(nn.Module):
    """The whole model: embeddings, decoder layers, final norm, LM head (tied or not).

    `spec` defaults to plain Llama's; `models.build_model` passes each family's own
    (`models/__init__.py`), so build through it unless the config is Llama's.
    """

    def __init__(
        self, config: PretrainedConfig, max_positions: int, spec: DecoderSpec | None = None
    ) -> None:
        super().__init__()
        spec = LLAMA if spec is None else spec
        self.config, self.spec = config, spec
        # `_weight` skips the random init: every weight is loaded, and the model is built on the
        # meta device, where the first `normal_` costs ~1.5 s of torch's lazy set-up per process.
        table = torch.empty(config.vocab_size, config.hidden_size)
        # The dense table, or its file's codes where nothing else reads it (`weights.embedding`)
        self.embed_tokens: nn.Embedding | FileEmbedding = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=table
        )
        self.layers = nn.ModuleList(
            self.make_layer(config, i, spec) for i in range(config.num_hidden_layers)
        )
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (
            None if self.tied else Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rope = RotaryEmbedding(config, head_dim_of(config), max_positions)
        self.embedding_multiplier = float(config.embedding_multiplier) if spec.multipliers else 1.0
        self.logits_scaling = float(config.logits_scaling) if spec.multipliers else 1.0
        # A packed 8-bit copy of the LM head, for the passes that run int kernels (the runner).
        self.head_packed: PackedWeight | None = None
        # A tied head's table in oneDNN's layout, for the dense passes (`prepack_dense`).
        self.head_prepacked: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the dense weights' (the final norm's, which every model
        keeps dense; the token table may be codes, `weights.embedding`)."""
        return self.norm.dtype

    def make_layer(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec) -> nn.Module:
        """Decoder block `layer_id`; a family with a block of its own overrides this."""
        return layer_class(spec)(config, layer_id, spec)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, pool: KVPool
    ) -> torch.Tensor:
        """input_ids: (T,) → final hidden states (T, hidden); each token's K/V goes to the pool."""
        x = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        for layer in self.layers:
            x = layer.forward(x, meta, pool)
        return F.rms_norm(x, x.shape[-1:], self.norm, self.config.rms_norm_eps)

    def prepack_dense(self) -> int:
        """Moves every dense linear weight, and a tied head's copy of the embedding table, into
        oneDNN's layout where that runs here (`weights.onednn`); returns how many moved. Called
        once the load is done with the plain weights."""
        moved = sum(m.prepack_dense() for m in self.modules() if isinstance(m, Linear))
        if self.lm_head is None and isinstance(self.embed_tokens, nn.Embedding):
            # the table itself stays plain: the embedding reads its rows
            self.head_prepacked = onednn.prepack(self.embed_tokens.weight)
            moved += self.head_prepacked is not None
        return moved

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, use_int: bool = False) -> torch.Tensor:
        """hidden: (N, hidden) → float32 logits (N, vocab); `head_packed` for int passes."""
        packed = self.head_packed
        head = self.lm_head  # None exactly when tied
        if packed is not None and use_int:
            logits = packed.matmul(hidden.to(packed.input_dtype)).float()
        elif head is not None:
            logits = head.run(hidden, use_int=False).float()
        elif self.head_prepacked is not None:
            logits = onednn.linear(hidden, self.head_prepacked).float()
        else:
            assert isinstance(self.embed_tokens, nn.Embedding), "a codes table runs packed heads"
            logits = dense_linear(hidden, self.embed_tokens.weight).float()
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    def weight_plan(self, names: set[str]) -> dict[str, WeightSource]:
        """Where each of our parameters may come from in a checkpoint holding `names`.

        It names every tensor a family can have (biases, q/k norms); `load_checked` reads only
        those our parameters, sized from the config, call for.
        """
        plan: dict[str, WeightSource] = {}
        for i, block in enumerate(self.layers):
            # NOTE: Llama's blocks; a family with its own (Gemma) loads its own way.
            layer = cast(DecoderLayer, block)
            p, ours = f"model.layers.{i}.", f"layers.{i}."
            inter = layer.mlp.intermediate
            qkv: tuple[str, ...]
            gate_up: tuple[str, ...]
            qkv_rows: tuple[int, ...]
            gate_up_rows: tuple[int, ...]
            if self.spec.fused_checkpoint:
                qkv, qkv_rows = (p + "self_attn.qkv_proj",), ()
                gate_up, gate_up_rows = (p + "mlp.gate_up_proj",), ()
            else:
                qkv = tuple(p + f"self_attn.{n}_proj" for n in "qkv")
                qkv_rows = layer.self_attn.split_sizes
                gate_up, gate_up_rows = (p + "mlp.gate_proj", p + "mlp.up_proj"), (inter, inter)
            parts = {
                "self_attn.qkv_proj": (qkv, qkv_rows),
                "self_attn.o_proj": ((p + "self_attn.o_proj",), ()),
                "mlp.gate_up_proj": (gate_up, gate_up_rows),
                "mlp.down_proj": ((p + "mlp.down_proj",), ()),
            }
            for module, (hf, rows) in parts.items():
                for kind in ("weight", "bias"):
                    plan[f"{ours}{module}.{kind}"] = WeightSource(
                        tuple(f"{n}.{kind}" for n in hf), rows
                    )
            for norm in (*layer.norm_names, "self_attn.q_norm", "self_attn.k_norm"):
                plan[ours + norm] = WeightSource((f"{p}{norm}.weight",))
        embed = "model.embed_tokens.weight"
        plan["embed_tokens.weight"] = WeightSource((embed,))
        plan["norm"] = WeightSource(("model.norm.weight",))
        head = "lm_head.weight" if "lm_head.weight" in names else embed  # untied, but saved once
        plan["lm_head.weight"] = WeightSource((head,))
        return plan

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads weights named as in transformers, fusing q/k/v and gate/up as it goes.

        A checkpoint that does not fit the config is a ModelLoadError naming the tensor.
        """
        skipped = ("lm_head.weight",) if self.tied else ()
        load_checked(self, state, self.weight_plan(set(state)), skipped)

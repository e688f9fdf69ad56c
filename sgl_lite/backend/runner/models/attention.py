"""Grouped-query attention over the token-slot KV pool, shared by every decoder family.

Q, K and V come from one fused projection; the new K/V go to the pool by slot id; each group of
requests (`AttentionGroup`) attends over its sequences: gathered from the pool, from the decode
copies kept between steps, over shared prefixes read once, or, for prefill from position 0, with
SDPA's own causal masking. The model never sees requests, only tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.models.metadata import AttentionGroup, AttentionMetadata
from sgl_lite.backend.runner.models.rope import apply_partial_rope, apply_rope, rotary_dim_of
from sgl_lite.backend.runner.models.shared_prefix import attend_shared
from sgl_lite.backend.runner.models.spec import LLAMA, DecoderSpec
from sgl_lite.backend.runner.weights.linear import Linear


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
            # Plain softmax layers take the mask converted once for every layer; the others
            # (Gemma's soft-capping) combine the boolean mask themselves.
            mask = group.additive_mask(attn) if self.plain_softmax else group.mask
            out = self._core(q_batched, k_batched, v_batched, mask)
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


def head_dim_of(config: PretrainedConfig) -> int:
    """Per-head width: explicit in newer configs, hidden/heads otherwise."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

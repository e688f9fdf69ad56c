"""Decode attention that reads a prefix shared by several requests once (cascade attention).

Requests that branch off one cached prompt (a system prompt, few-shot examples, `fork`) hold the
same pool slots for it: the radix cache gives them the same K/V. Padded per-row attention
gathers and reads that prefix once per row; at 64 rows of 576 positions, 4 prompts of 512 tokens
shared 16 ways, that was 61 % of a decode step, and the gather 16 % more. Here each shared
prefix is attended once by all its rows' queries together (one call, a real GEMM's shape instead
of 16 thin ones), each row's own suffix by a padded call over the suffixes, and the two results
are merged exactly through their log-sum-exp:

    out = (out_p * exp(lse_p - m) + out_s * exp(lse_s - m)) / (exp(lse_p - m) + exp(lse_s - m))

with m = max(lse_p, lse_s). This is softmax attention over the whole sequence, computed in
another order: the fast mode's per-token agreement bounds hold; the deterministic mode, whose
results must not depend on the batch, never uses it (`ModelRunner._shared_prefixes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_lite.backend.types import Segment

# A prefix is shared when at least this many leading slots are the same in two or more rows.
MIN_PREFIX = 32
# ... and the cascade runs when the rows' shared prefixes hold at least this share of the keys a
# padded pass would read: below it, the extra calls cost more than the repeats they save.
MIN_SAVED_SHARE = 0.5


@dataclass(frozen=True)
class SharedPrefixes:
    """A decode batch cut into shared prefixes and per-row suffixes.

    B = rows (one decode token each), S = longest suffix. A row in no group has its whole
    sequence as its suffix. Every suffix holds at least the row's own new token.
    """

    members: tuple[torch.Tensor, ...]  # per prefix: (n,) the rows that share it
    prefixes: tuple[torch.Tensor, ...]  # per prefix: (L,) its pool slots
    suffix_flat: torch.Tensor  # (B * S,) each row's slots past its prefix, padding → slot 0
    suffix_len: int  # S
    # (B, 1, 1, S) True at real keys (`placed`: 0 there, -inf at padding, in the dtype attention
    # computes in, as the flash kernel takes it); None when no suffix is padded
    suffix_mask: torch.Tensor | None


def find_shared_prefixes(segments: list[Segment]) -> SharedPrefixes | None:
    """The shared prefixes of a batch of single-token decodes, or None when sharing saves less
    than MIN_SAVED_SHARE of the keys read (or there is none).

    Rows are grouped by their first slot; a group's prefix is the longest run of leading slots
    all its rows hold, stopped one short of its shortest row so each row keeps its own token.
    """
    by_first: dict[int, list[int]] = {}
    for b, seg in enumerate(segments):
        by_first.setdefault(int(seg.kv_slots[0]), []).append(b)
    members, prefixes = [], []
    prefix_of = [0] * len(segments)
    saved = 0
    for rows in by_first.values():
        if len(rows) < 2:
            continue
        limit = min(segments[b].end for b in rows) - 1
        if limit < MIN_PREFIX:
            continue
        stacked = torch.stack([segments[b].kv_slots[:limit] for b in rows])  # (n, limit)
        differs = (stacked != stacked[0]).any(0).nonzero()
        length = int(differs[0]) if len(differs) else limit
        if length < MIN_PREFIX:
            continue
        members.append(torch.tensor(rows))
        prefixes.append(stacked[0, :length].clone())
        for b in rows:
            prefix_of[b] = length
        saved += (len(rows) - 1) * length
    if not members or saved < MIN_SAVED_SHARE * sum(seg.end for seg in segments):
        return None
    suffixes = [seg.kv_slots[start : seg.end] for seg, start in zip(segments, prefix_of)]
    lens = torch.tensor([len(s) for s in suffixes])
    longest = int(lens.max())
    padded = torch.zeros(len(segments), longest, dtype=torch.long)
    for b, suffix in enumerate(suffixes):
        padded[b, : len(suffix)] = suffix
    mask = None
    if int(lens.min()) < longest:
        mask = (torch.arange(longest)[None, :] < lens[:, None]).view(len(segments), 1, 1, longest)
    return SharedPrefixes(tuple(members), tuple(prefixes), padded.flatten(), longest, mask)


def placed(shared: SharedPrefixes, device: torch.device, dtype: torch.dtype) -> SharedPrefixes:
    """The same cut on `device`, its mask additive for K/V of `dtype`, built once per pass."""
    mask = shared.suffix_mask
    if mask is not None:
        additive = torch.zeros(mask.shape, dtype=compute_dtype(dtype))
        mask = additive.masked_fill_(~mask, float("-inf")).to(device)
    return SharedPrefixes(
        tuple(m.to(device) for m in shared.members),
        tuple(p.to(device) for p in shared.prefixes),
        shared.suffix_flat.to(device),
        shared.suffix_len,
        mask,
    )


def attend_shared(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    shared: SharedPrefixes,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of decode queries q (B, Hkv, G, D) (G query heads per KV head) over their
    sequences in one layer's pool K/V (slots, Hkv, D) → (B, Hkv, G, D) in `compute_dtype(K/V)`.

    Both partial results and their merge stay in float32 (bf16 K/V are widened as they are
    gathered), so the output is rounded once, by the caller, as a padded pass's is: on this
    shape float32 runs as fast as bf16 on the CPU's flash kernel (measured, AVX512-BF16)."""
    batch, heads, per_kv, dim = q.shape
    dtype = compute_dtype(k_pool.dtype)
    q = q.to(dtype)
    # CPU's flash kernel, which also returns each query's log-sum-exp (float32, natural log).
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    shape = (batch, shared.suffix_len, heads, dim)
    k_suffix = k_pool.index_select(0, shared.suffix_flat).view(shape).transpose(1, 2).to(dtype)
    v_suffix = v_pool.index_select(0, shared.suffix_flat).view(shape).transpose(1, 2).to(dtype)
    out, lse = flash(q, k_suffix, v_suffix, attn_mask=shared.suffix_mask, scale=scale)
    out = out.clone()  # (B, Hkv, G, D); the prefixes' rows are merged into it below
    for rows, slots in zip(shared.members, shared.prefixes):
        n = len(rows)
        # The group's queries as one (1, Hkv, n * G, D) block: one call reads the prefix once.
        q_rows = q.index_select(0, rows).transpose(0, 1).reshape(1, heads, n * per_kv, dim)
        k_prefix = k_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(dtype)
        v_prefix = v_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(dtype)
        out_p, lse_p = flash(q_rows, k_prefix, v_prefix, scale=scale)  # (1, Hkv, n * G, ...)
        out_p = out_p.view(heads, n, per_kv, dim).transpose(0, 1)  # (n, Hkv, G, D)
        lse_p = lse_p.view(heads, n, per_kv).transpose(0, 1)  # (n, Hkv, G)
        out_s, lse_s = out.index_select(0, rows), lse.index_select(0, rows)
        top = torch.maximum(lse_p, lse_s)
        w_p = torch.exp(lse_p - top).unsqueeze(-1)
        w_s = torch.exp(lse_s - top).unsqueeze(-1)
        out.index_copy_(0, rows, (out_p * w_p + out_s * w_s) / (w_p + w_s))
    return out


def compute_dtype(kv_dtype: torch.dtype) -> torch.dtype:
    """The dtype the cascade computes in: float32, or the K/V's own where that is wider."""
    return torch.promote_types(kv_dtype, torch.float32)

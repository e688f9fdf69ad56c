"""Decode attention that reads a prefix shared by several requests once (cascade attention).

Requests that branch off one cached prompt (a system prompt, few-shot examples, `fork`) hold the
same pool slots for it: the radix cache gives them the same K/V. Padded per-row attention
gathers and reads that prefix once per row; at 64 rows of 576 positions, 4 prompts of 512 tokens
shared 16 ways, that was 61 % of a decode step, and the gather 16 % more. Here each shared
prefix is gathered once and attended by all its rows' queries together (the prefixes side by
side in one call: a GEMM's shape per prefix instead of 16 thin ones), each row's own suffix by
a padded call over the suffixes, and the two results are merged exactly through their
log-sum-exp (float32):

    out = (out_p * exp(lse_p - m) + out_s * exp(lse_s - m)) / (exp(lse_p - m) + exp(lse_s - m))

with m = max(lse_p, lse_s). This is softmax attention over the whole sequence, computed in
another order: the fast mode's per-token agreement bounds hold; the deterministic mode, whose
results must not depend on the batch, never uses it (`decode_attention.reads_shared_prefixes`).
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

    B = rows (one decode token each), P = prefixes, N = most rows on one prefix, L = longest
    prefix, S = longest suffix. A row on no prefix has its whole sequence as its suffix; every
    suffix holds at least the row's own new token. The masks are None where nothing is padding,
    else True at real keys (after `placed`: additive, 0 there and -inf at padding, in the K/V's
    dtype, as the flash kernel takes them).
    """

    rows: torch.Tensor  # (R,) the rows on a prefix, prefix by prefix
    q_index: torch.Tensor  # (P, N) the row of each prefix's n-th query; padding → row 0
    q_flat: torch.Tensor  # (R,) where each of `rows` sits in the (P * N) layout
    prefix_flat: torch.Tensor  # (P * L,) each prefix's slots, padding → slot 0
    prefix_len: int  # L
    prefix_mask: torch.Tensor | None  # (P, 1, 1, L)
    suffix_flat: torch.Tensor  # (B * S,) each row's slots past its prefix, padding → slot 0
    suffix_len: int  # S
    suffix_mask: torch.Tensor | None  # (B, 1, 1, S)


def find_shared_prefixes(segments: list[Segment]) -> SharedPrefixes | None:
    """The shared prefixes of a batch of single-token decodes, or None when sharing saves less
    than MIN_SAVED_SHARE of the keys read (or there is none).

    Rows are grouped by their first slot; a group's prefix is the longest run of leading slots
    all its rows hold, stopped one short of its shortest row so each row keeps its own token.
    """
    by_first: dict[int, list[int]] = {}
    for b, seg in enumerate(segments):
        by_first.setdefault(int(seg.kv_slots[0]), []).append(b)
    members: list[list[int]] = []
    prefixes: list[torch.Tensor] = []
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
        members.append(rows)
        prefixes.append(stacked[0, :length])
        for b in rows:
            prefix_of[b] = length
        saved += (len(rows) - 1) * length
    if not members or saved < MIN_SAVED_SHARE * sum(seg.end for seg in segments):
        return None
    most = max(len(rows) for rows in members)
    q_index = torch.zeros(len(members), most, dtype=torch.long)
    for p, rows in enumerate(members):
        q_index[p, : len(rows)] = torch.tensor(rows)
    prefix_flat, prefix_len, prefix_mask = _padded(prefixes)
    suffix_flat, suffix_len, suffix_mask = _padded(
        [seg.kv_slots[start : seg.end] for seg, start in zip(segments, prefix_of)]
    )
    return SharedPrefixes(
        rows=torch.tensor([b for rows in members for b in rows]),
        q_index=q_index,
        q_flat=torch.tensor(
            [p * most + n for p, rows in enumerate(members) for n in range(len(rows))]
        ),
        prefix_flat=prefix_flat,
        prefix_len=prefix_len,
        prefix_mask=prefix_mask,
        suffix_flat=suffix_flat,
        suffix_len=suffix_len,
        suffix_mask=suffix_mask,
    )


def _padded(runs: list[torch.Tensor]) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """Runs of slots side by side: (len(runs) * longest,) padded with slot 0, the longest run,
    and a (len(runs), 1, 1, longest) mask of the real keys (None when none is padding)."""
    lens = torch.tensor([len(run) for run in runs])
    longest = int(lens.max())
    padded = torch.zeros(len(runs), longest, dtype=torch.long)
    for i, run in enumerate(runs):
        padded[i, : len(run)] = run
    mask = None
    if int(lens.min()) < longest:
        mask = (torch.arange(longest)[None, :] < lens[:, None]).view(len(runs), 1, 1, longest)
    return padded.flatten(), longest, mask


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask in SDPA's additive form: 0 where it is True, -inf elsewhere, in
    `dtype` on the mask's device (SDPA makes the same values from a boolean mask at every call)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def placed(shared: SharedPrefixes, device: torch.device, dtype: torch.dtype) -> SharedPrefixes:
    """The same cut on `device`, its masks additive for K/V of `dtype`, built once per pass."""

    def placed_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
        return None if mask is None else additive(mask, dtype).to(device)

    return SharedPrefixes(
        rows=shared.rows.to(device),
        q_index=shared.q_index.to(device),
        q_flat=shared.q_flat.to(device),
        prefix_flat=shared.prefix_flat.to(device),
        prefix_len=shared.prefix_len,
        prefix_mask=placed_mask(shared.prefix_mask),
        suffix_flat=shared.suffix_flat.to(device),
        suffix_len=shared.suffix_len,
        suffix_mask=placed_mask(shared.suffix_mask),
    )


def attend_shared(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    shared: SharedPrefixes,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of decode queries q (B, Hkv, G, D) (G query heads per KV head) over their
    sequences in one layer's pool K/V (slots, Hkv, D) → (B, Hkv, G, D), float32.

    The two calls run in the K/V's dtype on views of the gathered rows: widening bf16 K/V to
    float32 first cost a copy per call that took as long as the attention (2 threads, 64 rows);
    the partial results are merged in float32 and rounded once more by the caller."""
    batch, heads, per_kv, dim = q.shape
    q = q.to(k_pool.dtype)
    # CPU's flash kernel, which also returns each query's log-sum-exp (float32, natural log).
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    shape = (batch, shared.suffix_len, heads, dim)
    k_suffix = k_pool.index_select(0, shared.suffix_flat).view(shape).transpose(1, 2)
    v_suffix = v_pool.index_select(0, shared.suffix_flat).view(shape).transpose(1, 2)
    out, lse = flash(q, k_suffix, v_suffix, attn_mask=shared.suffix_mask, scale=scale)
    out = out.float()  # (B, Hkv, G, D); the prefixes' rows are merged into it below
    # The prefixes side by side, each with its rows' queries as (Hkv, N * G) query rows.
    prefixes, most = shared.q_index.shape
    shape = (prefixes, shared.prefix_len, heads, dim)
    k_prefix = k_pool.index_select(0, shared.prefix_flat).view(shape).transpose(1, 2)
    v_prefix = v_pool.index_select(0, shared.prefix_flat).view(shape).transpose(1, 2)
    q_prefix = q.index_select(0, shared.q_index.flatten()).view(prefixes, most, heads, per_kv, dim)
    q_prefix = q_prefix.transpose(1, 2).reshape(prefixes, heads, most * per_kv, dim)
    out_p, lse_p = flash(q_prefix, k_prefix, v_prefix, attn_mask=shared.prefix_mask, scale=scale)
    # Back to one entry per row on a prefix: (P, Hkv, N * G, ...) → (R, Hkv, G, ...)
    out_p = out_p.view(prefixes, heads, most, per_kv, dim).transpose(1, 2)
    out_p = out_p.reshape(prefixes * most, heads, per_kv, dim).index_select(0, shared.q_flat)
    lse_p = lse_p.view(prefixes, heads, most, per_kv).transpose(1, 2)
    lse_p = lse_p.reshape(prefixes * most, heads, per_kv).index_select(0, shared.q_flat)
    out_s, lse_s = out.index_select(0, shared.rows), lse.index_select(0, shared.rows)
    top = torch.maximum(lse_p, lse_s)
    w_p = torch.exp(lse_p - top).unsqueeze(-1)
    w_s = torch.exp(lse_s - top).unsqueeze(-1)
    merged = (out_p.float() * w_p + out_s * w_s) / (w_p + w_s)
    return out.index_copy_(0, shared.rows, merged)

"""Decode attention that reads shared prefixes once (runner/models/shared_prefix.py) is softmax
attention over each row's whole sequence, and the runner uses it only where that holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from sgl_lite.backend.runner.decode_attention import reads_shared_prefixes
from sgl_lite.backend.runner.models import shared_prefix
from sgl_lite.backend.runner.models.shared_prefix import (
    attend_shared,
    find_shared_prefixes,
    placed,
)
from sgl_lite.backend.runner.weights.formats import resolve_format
from sgl_lite.backend.types import Segment
from tests.support.tiny import DECODE_VOCAB, prefill_branches, tiny_runner

CPU = torch.device("cpu")


def _decode_rows(prefixes: list[torch.Tensor], rows: list[tuple[int | None, torch.Tensor]]):
    """One single-token decode segment per (prefix index or None, own slots) row."""
    segments = []
    for g, own in rows:
        slots = own if g is None else torch.cat([prefixes[g], own])
        segments.append(Segment(token_ids=[1], start=len(slots) - 1, kv_slots=slots, logits_from=0))
    return segments


def test_rows_are_grouped_by_the_prefix_they_hold_and_keep_their_own_token(monkeypatch):
    monkeypatch.setattr(shared_prefix, "MIN_SAVED_SHARE", 0.0)
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(0))
    prefixes = [perm[:40], perm[40:100]]
    own = [perm[100 + 10 * i : 100 + 10 * i + n] for i, n in enumerate([3, 5, 1, 9, 7, 1])]
    rows = [(0, own[0]), (0, own[1]), (1, own[2]), (None, own[3]), (1, own[4]), (0, own[5])]
    shared = find_shared_prefixes(_decode_rows(prefixes, rows))
    assert shared is not None
    assert shared.rows.tolist() == [0, 1, 5, 2, 4]  # prefix by prefix
    assert shared.q_index.tolist() == [[0, 1, 5], [2, 4, 0]]  # the second padded
    assert shared.q_flat.tolist() == [0, 1, 2, 3, 4]
    assert shared.prefix_len == 60
    heads = shared.prefix_flat.view(2, 60)
    assert (
        heads[0, :40].tolist() == prefixes[0].tolist()
        and not shared.prefix_mask[0, 0, 0, 40:].any()
    )
    assert heads[1].tolist() == prefixes[1].tolist() and shared.prefix_mask[1].all()
    assert shared.suffix_len == 9  # the ungrouped row's whole sequence
    # a row whose whole sequence but its new token is the prefix keeps that token as suffix
    suffixes = shared.suffix_flat.view(6, 9)
    assert suffixes[2, 0] == own[2][0] and not shared.suffix_mask[2, 0, 0, 1:].any()


def test_no_cut_where_sharing_saves_too_little():
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(1))
    short = [perm[: shared_prefix.MIN_PREFIX - 1]]
    rows = [(0, perm[100:102]), (0, perm[102:104])]
    assert find_shared_prefixes(_decode_rows(short, rows)) is None  # prefix below MIN_PREFIX
    long = [perm[:40]]
    # two rows share 40 keys, a third brings 200 of its own: under half the keys are saved
    rows = [(0, perm[100:102]), (0, perm[102:104]), (None, perm[150:350])]
    assert find_shared_prefixes(_decode_rows(long, rows)) is None
    # three rows on it: 80 of 126 keys are repeats
    rows = [*rows[:2], (0, perm[104:106])]
    assert find_shared_prefixes(_decode_rows(long, rows)) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_over_shared_prefixes_is_attention_over_each_whole_sequence(monkeypatch, dtype):
    monkeypatch.setattr(shared_prefix, "MIN_SAVED_SHARE", 0.0)
    gen = torch.Generator().manual_seed(2)
    heads, per_kv, dim = 2, 3, 16
    k_pool = torch.randn(500, heads, dim, generator=gen).to(dtype)
    v_pool = torch.randn(500, heads, dim, generator=gen).to(dtype)
    perm = torch.randperm(500, generator=gen)
    prefixes = [perm[:40], perm[40:100]]
    own = [perm[100 + 60 * i : 100 + 60 * i + n] for i, n in enumerate([3, 5, 1, 50, 7, 1])]
    rows = [(0, own[0]), (0, own[1]), (1, own[2]), (None, own[3]), (1, own[4]), (0, own[5])]
    segments = _decode_rows(prefixes, rows)
    shared = placed(find_shared_prefixes(segments), CPU, dtype)
    q = torch.randn(len(segments), heads, per_kv, dim, generator=gen).to(dtype)
    got = attend_shared(q, k_pool, v_pool, shared, scale=0.3)
    assert got.dtype == torch.float32  # rounded once more, by the caller
    bound = 1e-6 if dtype == torch.float32 else 2e-2
    for b, seg in enumerate(segments):
        k = k_pool[seg.kv_slots].transpose(0, 1).double()
        v = v_pool[seg.kv_slots].transpose(0, 1).double()
        want = F.scaled_dot_product_attention(q[b].double(), k, v, scale=0.3)
        assert (got[b].double() - want).abs().max() < bound


def _decode_steps(runner, seqs, steps: int) -> list[torch.Tensor]:
    out = []
    for step in range(steps):
        segments = [
            Segment(
                token_ids=[(5 * step + i) % DECODE_VOCAB],
                start=n + step,
                kv_slots=slots[: n + step + 1],
                logits_from=0,
            )
            for i, (n, slots) in enumerate(seqs)
        ]
        out.append(runner.forward(segments).logits)
    return out


def test_decode_steps_over_shared_prefixes_give_the_padded_passes_logits(monkeypatch):
    runner = tiny_runner()
    seqs = prefill_branches(runner, 48, own=[2, 9, 4, 1], extra=6)
    snapshot = (runner.pool.k.clone(), runner.pool.v.clone())
    runner.shared_prefixes = False
    padded = _decode_steps(runner, seqs, 6)
    runner.pool.k.copy_(snapshot[0])
    runner.pool.v.copy_(snapshot[1])
    calls = []
    counted = shared_prefix.attend_shared

    def counting(*args, **kwargs):
        calls.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr("sgl_lite.backend.runner.models.attention.attend_shared", counting)
    runner.shared_prefixes = True
    cascaded = _decode_steps(runner, seqs, 6)
    assert len(calls) == 6 * 2  # every step, both layers
    for a, b in zip(padded, cascaded):
        assert (a - b).abs().max() <= 1e-5


def test_only_the_fast_mode_on_plain_softmax_attention_reads_shared_prefixes():
    fast = resolve_format(
        dtype="float32", quantization="auto", device="cpu", caps=None, file_kind="int4"
    )
    exact = replace(fast, deterministic=True)
    llama = tiny_runner().model
    assert reads_shared_prefixes(CPU, fast, llama)
    assert not reads_shared_prefixes(CPU, exact, llama)  # batch-dependent rounding
    assert not reads_shared_prefixes(torch.device("cuda"), fast, llama)  # a CPU kernel
    gemma = tiny_runner("gemma2", head_dim=16, query_pre_attn_scalar=16).model
    assert not reads_shared_prefixes(CPU, fast, gemma)  # soft-capping and sliding windows

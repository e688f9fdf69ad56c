"""Prefill from position 0 leaves the causal mask to SDPA (`Attention._attend_causal`) and gives
what the group's explicit mask gives; every other pass keeps the mask, converted once per pass
into SDPA's additive form (`AttentionGroup.additive_mask`)."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.runner.models.attention import Attention
from sgl_lite.backend.runner.models.metadata import AttentionGroup
from sgl_lite.backend.types import Segment
from tests.support.tiny import DECODE_VOCAB, tiny_runner

LENGTHS = [9, 30, 17]  # padded together: the two shorter rows' queries past their ends are dropped


@pytest.fixture
def causal_calls(monkeypatch) -> list[int]:
    """The layer ids of every `_attend_causal` call."""
    calls: list[int] = []
    original = Attention._attend_causal

    def counted(self, *args):
        calls.append(self.layer_id)
        return original(self, *args)

    monkeypatch.setattr(Attention, "_attend_causal", counted)
    return calls


def _ids(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, DECODE_VOCAB, (n,), generator=gen).tolist()


def _prefill(runner, lengths: list[int]) -> torch.Tensor:
    """Every token's logits for fresh requests of `lengths`, prefilled in one pass."""
    segments = []
    for i, n in enumerate(lengths):
        slots = runner.pool.alloc(n)
        segments.append(Segment(token_ids=_ids(n, i), start=0, kv_slots=slots, logits_from=0))
    logits = runner.forward(segments).logits
    for seg in segments:
        runner.pool.free(seg.kv_slots)
    return logits


def test_prefill_from_the_start_matches_the_masked_path(monkeypatch, causal_calls):
    runner = tiny_runner()
    for lengths in (LENGTHS, [23]):  # padded rows, and one request alone
        causal_calls.clear()
        causal = _prefill(runner, lengths)
        assert len(causal_calls) == len(runner.model.layers)  # every layer took the path
        with monkeypatch.context() as patch:
            patch.setattr(Attention, "plain_softmax", False)  # the folded, masked path
            masked = _prefill(runner, lengths)
        assert len(causal_calls) == len(runner.model.layers)
        assert causal.shape == masked.shape == (sum(lengths), DECODE_VOCAB)
        assert (causal - masked).abs().max() <= 1e-5
        assert torch.equal(causal.argmax(-1), masked.argmax(-1))


def test_a_chunk_after_a_cached_prefix_keeps_the_mask(causal_calls):
    runner = tiny_runner()
    ids = _ids(15, 0)
    slots = runner.pool.alloc(15)
    whole = runner.forward([Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=10)])
    causal_calls.clear()
    runner.forward([Segment(token_ids=ids[:10], start=0, kv_slots=slots[:10], logits_from=10)])
    assert len(causal_calls) == len(runner.model.layers)
    chunk = runner.forward([Segment(token_ids=ids[10:], start=10, kv_slots=slots, logits_from=0)])
    assert len(causal_calls) == len(runner.model.layers)  # the chunk sees the prefix: masked
    assert (chunk.logits - whole.logits).abs().max() <= 1e-5


def test_the_int_modes_float64_attention_keeps_its_one_path(monkeypatch, causal_calls):
    runner = tiny_runner()
    monkeypatch.setattr(Attention, "attn_dtype", torch.float64)
    logits = _prefill(runner, LENGTHS)
    assert causal_calls == []
    assert torch.isfinite(logits).all()


def test_the_chunks_mask_is_converted_once_for_every_layer(monkeypatch):
    """A chunk after a cached prefix attends with its mask in SDPA's additive form, made once
    per pass; the logits equal bit for bit those of SDPA converting the boolean mask itself."""
    runner = tiny_runner()
    ids = _ids(30, 3)
    slots = runner.pool.alloc(30)
    runner.forward([Segment(token_ids=ids[:20], start=0, kv_slots=slots[:20], logits_from=20)])
    chunk = [Segment(token_ids=ids[20:], start=20, kv_slots=slots, logits_from=0)]
    made: list[torch.dtype] = []
    original = AttentionGroup.additive_mask

    def counted(self, dtype):
        if dtype not in self._additive:
            made.append(dtype)
        return original(self, dtype)

    monkeypatch.setattr(AttentionGroup, "additive_mask", counted)
    additive = runner.forward(chunk).logits
    assert made == [torch.float32]  # one conversion, read by both layers
    monkeypatch.setattr(AttentionGroup, "additive_mask", lambda self, dtype: self.mask)
    boolean = runner.forward(chunk).logits
    assert torch.equal(additive, boolean)

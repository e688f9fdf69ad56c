"""`passes.pieces`: a prompt's chunk cut into graph runs of bounded size, which together compute
what the chunk does: the same tokens at the same positions and slots, the same logits rows."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.runner.passes import pieces
from sgl_lite.backend.types import Segment


def _wanted(segment: Segment) -> list[int]:
    """The absolute positions whose logits `segment` asks for."""
    return list(range(segment.start + segment.logits_from, segment.end))


@pytest.mark.parametrize("logits_from", [0, 1, 5, 6, 9, 10])
@pytest.mark.parametrize("size", [1, 3, 4, 10, 16])
def test_pieces_cover_the_chunk_in_order_and_want_its_logits(size, logits_from):
    chunk = Segment(
        token_ids=list(range(100, 110)),
        start=7,
        kv_slots=torch.arange(50, 67),
        logits_from=logits_from,
    )
    parts = pieces(chunk, size)
    assert all(1 <= len(p.token_ids) <= size for p in parts)
    assert len(parts) == -(-10 // size)
    assert [t for p in parts for t in p.token_ids] == chunk.token_ids
    assert [p.start for p in parts] == [7 + size * k for k in range(len(parts))]
    for part in parts:  # each sees the slots of the sequence up to its own end
        assert torch.equal(part.kv_slots, chunk.kv_slots[: part.end])
        assert 0 <= part.logits_from <= len(part.token_ids)
    assert [pos for p in parts for pos in _wanted(p)] == _wanted(chunk)


def test_a_chunk_within_the_bound_is_one_run_as_it_is():
    chunk = Segment(token_ids=[1, 2, 3], start=0, kv_slots=torch.arange(3), logits_from=2)
    assert pieces(chunk, 3) == [chunk]

"""The llguidance closer's lowest allowed token on packed words (llguidance_backend.first_allowed)
is closer.lowest_allowed's answer on the unpacked mask: random bitmasks and text masks, eos
excluded, bitmasks shorter and longer than the vocabulary, sparse and empty ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sgl_lite.backend.constrained.matchers.closer import lowest_allowed
from sgl_lite.backend.constrained.matchers.llguidance_backend import (
    first_allowed,
    packed_text_words,
)


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """(V,) bool → the (ceil(V/32),) int32 words a backend fills (bit j of word w: 32·w + j)."""
    bits = np.zeros(-(-allowed.shape[0] // 32) * 32, dtype=np.uint64)
    bits[: allowed.shape[0]] = allowed.numpy()
    words = (bits.reshape(-1, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("density", [0.0, 0.0005, 0.02, 0.5])
@pytest.mark.parametrize("extra_words", [-2, 0, 3])
def test_first_allowed_matches_the_unpacked_lowest_allowed(
    seed: int, density: float, extra_words: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    vocab = 1000 + seed  # not a multiple of 32: a short last word
    text = torch.rand(vocab, generator=gen) > 0.1
    eos = int(torch.randint(vocab, (1,), generator=gen))
    text[eos] = True  # as text_token_mask keeps it
    backend_vocab = vocab + 32 * extra_words  # llguidance's vocabulary may differ in width
    allowed = torch.rand(backend_vocab, generator=gen) < density
    if density and seed % 2:
        allowed[: eos + 1] = False
        allowed[eos] = True  # eos alone below the first other token: never the answer
    words = _bitmask(allowed)
    expected = lowest_allowed(words, text, eos)
    got = first_allowed(words.numpy().tobytes(), packed_text_words(text, eos))
    assert got == expected


def test_the_packed_text_words_clear_eos_and_the_padding() -> None:
    text = torch.ones(40, dtype=torch.bool)
    words = packed_text_words(text, eos_token_id=33)
    assert words.tolist() == [0xFFFFFFFF, 0xFF & ~(1 << 1)]

"""Token bitmasks from the grammar backends (llguidance, xgrammar) → our (V,) bool masks.

Both backends fill an int32 bitmask of ceil(V/32) words, bit j of word w for token 32·w + j.
We unpack it to the sampler's bool mask over our vocabulary width, and AND it with the tokens
that may appear in constrained text at all (`TokenVocabulary.token_bytes` is None for special
and added tokens): a backend that reads a special token's text as ordinary text (xgrammar on
SmolLM2 sees `<|im_start|>` as eleven characters) could otherwise let it into a string.
"""

from __future__ import annotations

import threading

import torch

from sgl_lite.backend.constrained.vocab import TokenVocabulary

_SHIFTS = torch.arange(32, dtype=torch.int32)
_TEXT_MASKS: dict[int, tuple[TokenVocabulary, torch.Tensor]] = {}
_LOCK = threading.Lock()


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(W,) int32 bitmask → (vocab_size,) bool, True = allowed (ids past 32·W are False)."""
    bits = ((words.unsqueeze(1) >> _SHIFTS) & 1).flatten().bool()  # (32·W,)
    if bits.shape[0] >= vocab_size:
        return bits[:vocab_size]
    out = torch.zeros(vocab_size, dtype=torch.bool)
    out[: bits.shape[0]] = bits
    return out


def text_token_mask(vocab: TokenVocabulary) -> torch.Tensor:
    """(V,) bool: the tokens that may appear in constrained text, plus eos; built once."""
    with _LOCK:
        hit = _TEXT_MASKS.get(id(vocab))
        if hit is not None and hit[0] is vocab:
            return hit[1]
    mask = torch.tensor([b is not None for b in vocab.token_bytes], dtype=torch.bool)
    mask[vocab.eos_token_id] = True
    with _LOCK:
        _TEXT_MASKS[id(vocab)] = (vocab, mask)
    return mask

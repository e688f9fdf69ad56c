"""GGUF's block formats as integer codes with a scale and an offset per group, exactly.

Every llama.cpp format below stores, per group of 32 (or 16) weights, w = scale * q + offset
with small integer codes q, where scale and offset are float32 products of the block's fp16
fields and its small integer sub-scales. So each maps onto a `GroupAffine` whose
`dequantize()` gives the same float32 bits as gguf-py's `dequantize` (the tests check it on
random blocks of every type):

| format | codes | group | scale, offset |
|---|---|---|---|
| Q4_0 | 4-bit 0..15 | 32 | d, -8 d |
| Q4_1 | 4-bit 0..15 | 32 | d, m |
| Q4_K | 4-bit 0..15 | 32 | d sc, -(dmin m) (6-bit sc, m per 32) |
| Q5_0 | 8-bit -16..15 | 32 | d, 0 |
| Q5_1 | 8-bit 0..31 | 32 | d, m |
| Q5_K | 8-bit 0..31 | 32 | d sc, -(dmin m) |
| Q6_K | 8-bit -32..31 | 16 | d sc (int8 sc per 16), 0 |
| Q3_K | 8-bit -4..3 | 16 | d (sc - 32) (6-bit sc per 16), 0 |
| Q2_K | 8-bit 0..3 | 16 | d sc, -(dmin m) (4-bit sc, m per 16) |
| Q8_0 | 8-bit -127..127 | 32 | d, 0 |

The 5-, 6-, 3- and 2-bit codes are held as 8-bit codes (exact, wider than the file). Other
types (the IQ* lookup-table formats, TQ*, MXFP4) have no such form and are not decoded here.
The layouts follow ggml's reference (`ggml-quants.c`) as gguf-py's numpy port spells them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from sgl_lite.backend.runner.weights.quant import GroupAffine

SUPER = 256  # QK_K: the weights in one k-quant super-block


class BlockType(NamedTuple):
    """A ggml block format: its name, weights and bytes per block, its decoder, and the width
    and group of the codes it decodes to (the table above)."""

    name: str
    weights: int
    bytes: int
    decode: Callable[[np.ndarray], GroupAffine]  # (rows, blocks, bytes) → codes
    bits: int
    group: int


def _f16(raw: np.ndarray) -> np.ndarray:
    """(..., 2) bytes → (...) float32 from little-endian fp16."""
    # Viewed where they lie (the last axis is contiguous) and converted in one strided pass: a
    # copy of the 2-byte fields first took ~30 ns a scale (a 1B model's load: ~0.4 s).
    return raw.view(np.float16)[..., 0].astype(np.float32)


def _affine(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int) -> GroupAffine:
    """Per-row codes (rows, groups, group) and per-group scale/offset (rows, groups)."""
    rows, groups, group = q.shape
    return GroupAffine(
        torch.from_numpy(np.ascontiguousarray(q.reshape(rows, groups * group))),
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(offset, dtype=np.float32)),
        bits=bits,
        group=group,
    )


def _read_only(a: np.ndarray) -> torch.Tensor:
    """A tensor over `a` without a copy, for reading only: the file's map is read-only, and
    torch warns about such arrays although nothing here writes to them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)


def _copied(a: np.ndarray) -> np.ndarray:
    """A contiguous copy of the (strided) array `a`, made on torch (as `_nibbles`)."""
    return _read_only(a).clone(memory_format=torch.contiguous_format).numpy()


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes → (..., 32) codes: the 16 low nibbles, then the 16 high ones."""
    # On torch: its strided element-wise loops run ~4x faster than numpy's over these short
    # rows (a 1B model's codes: ~2.1 s → 0.5 s of its load).
    qs_t = _read_only(qs)
    out = torch.empty((*qs.shape[:-1], 2 * qs.shape[-1]), dtype=torch.uint8)
    torch.bitwise_and(qs_t, 0x0F, out=out[..., : qs.shape[-1]])
    torch.bitwise_right_shift(qs_t, 4, out=out[..., qs.shape[-1] :])
    return out.numpy()


def _high_low(low: np.ndarray, high: np.ndarray, less: int = 0) -> np.ndarray:
    """int8 codes `low | high << 4`, less `less`, computed in place in `high` (a fresh array of
    the same shape as `low`) on torch (as `_nibbles`)."""
    out = torch.from_numpy(high).bitwise_left_shift_(4).bitwise_or_(torch.from_numpy(low))
    codes = out.view(torch.int8)
    if less:
        codes.sub_(less)
    return codes.numpy()


def _q4_0(b: np.ndarray) -> GroupAffine:
    d = _f16(b[..., 0:2])
    return _affine(_nibbles(b[..., 2:]), d, -8 * d, bits=4)


def _q4_1(b: np.ndarray) -> GroupAffine:
    return _affine(_nibbles(b[..., 4:]), _f16(b[..., 0:2]), _f16(b[..., 2:4]), bits=4)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(..., 4) bytes, a little-endian bit per weight → (..., 32) of 0/1."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q5_0(b: np.ndarray) -> GroupAffine:
    codes = _nibbles(b[..., 6:]) | (_fifth_bits(b[..., 2:6]) << 4)
    d = _f16(b[..., 0:2])
    return _affine(codes.astype(np.int8) - np.int8(16), d, np.zeros_like(d), bits=8)


def _q5_1(b: np.ndarray) -> GroupAffine:
    codes = _nibbles(b[..., 8:]) | (_fifth_bits(b[..., 4:8]) << 4)
    return _affine(codes.astype(np.int8), _f16(b[..., 0:2]), _f16(b[..., 2:4]), bits=8)


def _q8_0(b: np.ndarray) -> GroupAffine:
    d = _f16(b[..., 0:2])
    return _affine(_copied(b[..., 2:]).view(np.int8), d, np.zeros_like(d), bits=8)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes → the 8 sub-blocks' 6-bit scales and minimums (..., 8)."""
    lo, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([lo & 0x3F, (high & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (high >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _shifted(data: np.ndarray, chunk: int, shifts: tuple[int, ...], mask: int) -> np.ndarray:
    """Bytes (rows, blocks, n * chunk) → (rows, blocks, n * len(shifts), chunk): each chunk of
    `chunk` bytes read once per shift, masked (ggml packs sub-blocks side by side this way)."""
    rows, blocks = data.shape[:2]
    chunks = _read_only(data).reshape(rows, blocks, -1, 1, chunk)
    out = torch.empty((*chunks.shape[:3], len(shifts), chunk), dtype=torch.uint8)
    for i, shift in enumerate(shifts):  # on torch, written in place: as `_nibbles`
        torch.bitwise_and(chunks[..., 0, :] >> shift, mask, out=out[..., i, :])
    return out.reshape(rows, blocks, -1, chunk).numpy()


def _super(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int) -> GroupAffine:
    """Codes (rows, blocks, subs, group) and (rows, blocks, subs) → one row of groups."""
    rows, blocks, subs, group = q.shape
    flat = (rows, blocks * subs)
    return _affine(
        q.reshape(rows, blocks * subs, group), scale.reshape(flat), offset.reshape(flat), bits
    )


def _q4_k(b: np.ndarray) -> GroupAffine:
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, mn = _k_scales(b[..., 4:16])
    q = _shifted(b[..., 16:], 32, (0, 4), 0x0F)  # (rows, blocks, 8, 32)
    return _super(q, d * sc, -(dmin * mn), bits=4)


def _q5_k(b: np.ndarray) -> GroupAffine:
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, mn = _k_scales(b[..., 4:16])
    low = _shifted(b[..., 48:], 32, (0, 4), 0x0F)
    high = _shifted(b[..., 16:48], 32, tuple(range(8)), 0x01)
    return _super(_high_low(low, high), d * sc, -(dmin * mn), bits=8)


def _q6_k(b: np.ndarray) -> GroupAffine:
    rows, blocks = b.shape[:2]
    low = _shifted(b[..., 0:128], 64, (0, 4), 0x0F).reshape(rows, blocks, 8, 32)
    high = _shifted(b[..., 128:192], 32, (0, 2, 4, 6), 0x03)
    q = _high_low(low, high, less=32).reshape(rows, blocks, 16, 16)
    d = _f16(b[..., 208:210])[..., None]
    scale = d * b[..., 192:208].copy().view(np.int8).astype(np.float32)
    return _super(q, scale, np.zeros_like(scale), bits=8)


def _q3_k(b: np.ndarray) -> GroupAffine:
    rows, blocks = b.shape[:2]
    packed = b[..., 96:108]
    low = (packed[..., 0:8, None] >> np.array([0, 4], np.uint8)).swapaxes(-1, -2)
    high = (packed[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)).swapaxes(-1, -2)
    sc = (low.reshape(rows, blocks, 16) & 0x0F) | ((high.reshape(rows, blocks, 16) & 0x03) << 4)
    scale = _f16(b[..., 108:110])[..., None] * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
    q_low = _shifted(b[..., 32:96], 32, (0, 2, 4, 6), 0x03).reshape(rows, blocks, 16, 16)
    h = _shifted(b[..., 0:32], 32, tuple(range(8)), 0x01).reshape(rows, blocks, 16, 16)
    q = q_low.astype(np.int8) - ((h ^ 1) << 2).astype(np.int8)  # a clear bit subtracts 4
    return _super(q, scale, np.zeros_like(scale), bits=8)


def _q2_k(b: np.ndarray) -> GroupAffine:
    rows, blocks = b.shape[:2]
    packed = b[..., 0:16]
    d, dmin = _f16(b[..., 80:82])[..., None], _f16(b[..., 82:84])[..., None]
    scale = d * (packed & 0x0F).astype(np.float32)
    offset = -(dmin * (packed >> 4).astype(np.float32))
    q = _shifted(b[..., 16:80], 32, (0, 2, 4, 6), 0x03).reshape(rows, blocks, 16, 16)
    return _super(q.astype(np.int8), scale, offset, bits=8)


# ggml type ids → the formats decoded here
BLOCK_TYPES: dict[int, BlockType] = {
    2: BlockType("Q4_0", 32, 18, _q4_0, bits=4, group=32),
    3: BlockType("Q4_1", 32, 20, _q4_1, bits=4, group=32),
    6: BlockType("Q5_0", 32, 22, _q5_0, bits=8, group=32),
    7: BlockType("Q5_1", 32, 24, _q5_1, bits=8, group=32),
    8: BlockType("Q8_0", 32, 34, _q8_0, bits=8, group=32),
    10: BlockType("Q2_K", SUPER, 84, _q2_k, bits=8, group=16),
    11: BlockType("Q3_K", SUPER, 110, _q3_k, bits=8, group=16),
    12: BlockType("Q4_K", SUPER, 144, _q4_k, bits=4, group=32),
    13: BlockType("Q5_K", SUPER, 176, _q5_k, bits=8, group=32),
    14: BlockType("Q6_K", SUPER, 210, _q6_k, bits=8, group=16),
}


def joined(raws: list[np.ndarray]) -> np.ndarray:
    """Raw block rows of one format stacked into one matrix (the one array where it is alone),
    copied on torch (as `_nibbles`)."""
    if len(raws) == 1:
        return raws[0]
    return torch.cat([_read_only(raw) for raw in raws]).numpy()


def decode(type_id: int, raw: np.ndarray) -> GroupAffine:
    """Raw block bytes (rows, bytes per row) of ggml type `type_id` → codes, scales, offsets.
    Raises KeyError for a type with no exact integer form here."""
    kind = BLOCK_TYPES[type_id]
    rows = raw.shape[0]
    return kind.decode(raw.reshape(rows, -1, kind.bytes))

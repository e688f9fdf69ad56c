"""The quantized tensors of a GGUF file, read raw (not dequantized) and named as in transformers.

Only the block formats that map onto our int kernels are decoded: Q4_0 and Q4_1 (4-bit codes,
groups of 32) and Q8_0 (8-bit codes, groups of 32). Other tensors are left to the dequantized
safetensors copy the loader made. llama.cpp's converter permutes the rows of a Llama model's
q/k projections (its RoPE pairs adjacent dimensions, HF's pairs halves); we undo it exactly as
transformers' GGUF loader does, so the rows line up with the safetensors weights.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np
import torch
from transformers import PretrainedConfig

from sgl_lite.backend.weights.quant import GROUP, GroupAffine

# GGUF tensor name (after "blk.{i}.") → transformers name (after "model.layers.{i}.")
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.ffn_up.weight` → `model.layers.3.mlp.up_proj.weight`; None for other tensors."""
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.weight"
    return None


def _decode_blocks(kind: str, raw: np.ndarray, rows: int) -> GroupAffine:
    """Raw block bytes (rows, bytes per row) → codes, scales and offsets."""
    if kind in ("Q4_0", "Q4_1"):
        head = 2 if kind == "Q4_0" else 4  # fp16 d (and fp16 m for Q4_1), then 16 code bytes
        blocks = raw.reshape(rows, -1, head + GROUP // 2)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        if kind == "Q4_1":
            offset = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        else:  # Q4_0: w = d * (q - 8)
            offset = -8 * d
        codes = blocks[..., head:]
        # a block's first 16 weights are the low nibbles, the last 16 the high ones
        q = np.concatenate([codes & 0x0F, codes >> 4], axis=-1).reshape(rows, -1)
        return GroupAffine(
            torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(offset), bits=4
        )
    if kind == "Q8_0":
        blocks = raw.reshape(rows, -1, 2 + GROUP)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return GroupAffine(
            torch.from_numpy(q), torch.from_numpy(d), torch.zeros_like(torch.from_numpy(d)), bits=8
        )
    raise ValueError(f"unsupported GGUF block type {kind}")


def _unpermute_rows(rows: int, n_head: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's q/k permutation for `n_head` heads."""
    index = torch.arange(rows)
    return index.view(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(rows)


# ggml type ids of the block formats we decode, and bytes per block of 32 weights
_BLOCK_TYPES = {2: ("Q4_0", 18), 3: ("Q4_1", 20), 8: ("Q8_0", 34)}
# GGUF metadata value types with a fixed size: type id → bytes
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads little-endian GGUF header fields from a memory-mapped file."""

    _FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.pos = data, 0

    def uint(self, size: int) -> int:
        (value,) = struct.unpack_from(self._FORMATS[size], self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.uint(8)
        self.pos += n
        return self.data[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> int | None:
        """Skips one metadata value; returns it when it is a fixed-size integer."""
        if kind in _FIXED:
            return self.uint(_FIXED[kind])
        if kind == _STRING:
            n = self.uint(8)  # read first: `pos += self.uint(8)` would add to the stale pos
            self.pos += n
        elif kind == _ARRAY:
            item, count = self.uint(4), self.uint(8)
            if item in _FIXED:
                self.pos += _FIXED[item] * count
            else:  # strings (the vocabulary): each carries its own length
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"corrupt GGUF header: unknown value type {kind}")
        return None


def read_quantized(path: Path, config: PretrainedConfig) -> dict[str, GroupAffine]:
    """Every Q4_0/Q4_1/Q8_0 weight of the file, by transformers parameter name.

    The header is parsed here rather than with `gguf.GGUFReader`, which decodes every
    vocabulary string into Python objects and takes seconds for a 49k-token vocabulary.
    """
    with open(path, "rb") as file:
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.uint(4), cur.uint(8), cur.uint(8)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    alignment = 32
    for _ in range(n_kv):
        key, kind = cur.string(), cur.uint(4)
        value = cur.skip_value(kind)
        if key == "general.alignment" and value:
            alignment = value
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.uint(4)
        dims = [cur.uint(8) for _ in range(n_dims)]
        infos.append((name, dims, cur.uint(4), cur.uint(8)))
    base = -(-cur.pos // alignment) * alignment
    permute = config.model_type == "llama"
    out: dict[str, GroupAffine] = {}
    for name, dims, type_id, offset in infos:
        hf, block = hf_name(name), _BLOCK_TYPES.get(type_id)
        if hf is None or block is None:
            continue
        block_kind, block_bytes = block
        rows, cols = int(np.prod(dims[1:])), dims[0]  # GGUF lists the innermost dimension first
        size = rows * cols // GROUP * block_bytes
        raw = np.frombuffer(data, np.uint8, size, base + offset).reshape(rows, -1)
        if permute and hf.endswith(("q_proj.weight", "k_proj.weight")):
            # whole rows of blocks move, so permuting the raw bytes is exact and cheap
            heads = config.num_key_value_heads if "k_proj" in hf else config.num_attention_heads
            raw = raw[_unpermute_rows(rows, heads).numpy()]
        out[hf] = _decode_blocks(block_kind, raw, rows)
    return out

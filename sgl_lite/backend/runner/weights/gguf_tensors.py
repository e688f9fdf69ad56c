"""The tensors of a GGUF file, read from the memory-mapped file and named as in transformers.

Two readers: `FileCodes` gives the linear weights in a block format with an exact integer
form (`gguf_blocks`: Q4_0/1, Q5_0/1, Q8_0, Q2_K to Q6_K) as codes, scales and offsets, never
dequantized, each decoded when it is read (`read_quantized`: all of them at once);
`read_dense` gives every tensor the model needs as float32 (norms, biases, embeddings, and
linears the caller does not take as codes), dequantized one tensor at a time so no float32
copy of the whole file ever exists. What llama.cpp's converter changed, both readers
undo: it permutes the rows of the q/k projections of the families whose llama.cpp RoPE pairs
adjacent dimensions (HF's pairs halves): Llama and Granite (its converter is Llama's), no other
architecture's; and it stores every Gemma (1, 2, 3) RMSNorm weight as `1 + w` (read back
minus 1). Names differ by architecture: Gemma 2/3's `ffn_norm` is the norm before the MLP
(Llama's is the one after attention), OLMo 2 has only post-norms (`post_attention_norm`,
`post_ffw_norm`), and Phi-3 keeps its q/k/v and gate/up fused (`attn_qkv`, `ffn_up`), as its
HF checkpoint and our model do: their codes are the fused linears' codes as they stand. The
header parser is `gguf_header`.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Container, Iterator, MutableMapping
from pathlib import Path

import numpy as np
import torch
from transformers import PretrainedConfig

from sgl_lite.backend.runner.weights import gguf_blocks
from sgl_lite.backend.runner.weights.gguf_header import (
    GGUFFormatError,
    GGUFHeader,
    TensorInfo,
    read_header,
    tensor_bytes,
)
from sgl_lite.backend.runner.weights.quant import FUSED_PARTS, GroupAffine

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
# The other tensors of a layer (norms) and of the model, by the same rule.
_LAYER_OTHERS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_OTHERS = {"output_norm": "model.norm"}
# Where an architecture names a layer's tensor otherwise (llama.cpp's gguf-py `MODEL_TENSORS`).
_GEMMA_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_OLMO2_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_LAYER_OTHERS = {"gemma2": _GEMMA_NORMS, "gemma3": _GEMMA_NORMS, "olmo2": _OLMO2_NORMS}
# Linears a file holds fused (Phi-3), under the fused parameter's name.
_ARCH_FUSED = {"phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}}
# Architectures whose RMSNorm weights llama.cpp stores as 1 + w (every `*norm.weight`).
NORM_SHIFTED = ("gemma", "gemma2", "gemma3")
# Architectures whose q/k rows llama.cpp's converter permutes for its RoPE (`LlamaModel.permute`:
# Llama and its subclass Granite; Qwen, Phi-3, Gemma and OLMo 2 use the NeoX pairing as HF does).
ROPE_PERMUTED = ("llama", "granite")
# Tensors a file may carry that hold no weights: llama.cpp's RoPE factors (Llama 3's
# `rope_freqs`: RoPE is computed from the config, as transformers does; Phi-3's long/short
# factors: read into the config when it is converted, `model_loader`).
_IGNORED = ("rope_freqs", "rope_factors_long", "rope_factors_short")
_F32, _F16, _BF16 = 0, 1, 30  # ggml type ids of the plain float tensors
FLOAT_TYPE_IDS = frozenset((_F32, _F16, _BF16))


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """`blk.3.ffn_up.weight` → `model.layers.3.mlp.up_proj.weight` (linear weights and the
    embedding / head only, in `architecture`'s names; a fused linear by its fused name, Phi-3's
    `attn_qkv` → `self_attn.qkv_proj`); None for other tensors."""
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    fused = _ARCH_FUSED.get(architecture, {})
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in fused:
        return f"model.layers.{parts[1]}.{fused[parts[2]]}.weight"
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.weight"
    return None


def hf_tensor_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """Any tensor's transformers name in a file of `architecture`: linears (`hf_name`), their
    biases, norms, fused linears; None for a tensor that carries nothing we load (RoPE
    factors)."""
    parts = gguf_name.split(".")
    layer = {**_LAYER_NAMES, **_LAYER_OTHERS, **_ARCH_LAYER_OTHERS.get(architecture, {})}
    layer.update(_ARCH_FUSED.get(architecture, {}))
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    linear = hf_name(gguf_name, architecture)
    if linear is not None:
        return linear
    if parts[0] in _IGNORED:
        return None
    if len(parts) == 2 and parts[0] in _GLOBAL_OTHERS:
        return f"{_GLOBAL_OTHERS[parts[0]]}.{parts[1]}"
    raise GGUFFormatError(f"tensor {gguf_name!r} is not one a supported architecture has")


def _unpermute_rows(rows: int, n_head: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's q/k permutation for `n_head` heads."""
    index = torch.arange(rows)
    return index.view(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(rows)


def raw_rows(data: mmap.mmap, header: GGUFHeader, info: TensorInfo) -> np.ndarray:
    """A tensor's bytes as (rows, bytes per row), a view into the mapped file."""
    size = tensor_bytes(info)
    return np.frombuffer(data, np.uint8, size, header.data_start + info.offset).reshape(
        _rows(info), -1
    )


def _drop_pages(data: mmap.mmap, header: GGUFHeader, info: TensorInfo) -> None:
    """Lets the kernel drop a tensor's file pages from this process once it is decoded: each
    page read through the map otherwise stays resident until the map closes, so reading a
    whole file added its size to the load's peak memory (the page cache still holds them)."""
    if not hasattr(mmap, "MADV_DONTNEED"):  # not Linux/macOS: the map's pages stay
        return
    start = header.data_start + info.offset
    aligned = start - start % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):
        data.madvise(mmap.MADV_DONTNEED, aligned, start + tensor_bytes(info) - aligned)


def _permuted_heads(hf: str, header: GGUFHeader, config: PretrainedConfig) -> int | None:
    """The head count whose RoPE permutation llama.cpp applied to tensor `hf`'s rows, or None
    (only `ROPE_PERMUTED` files, whose q/k projection weights llama.cpp permutes)."""
    if header.architecture not in ROPE_PERMUTED or not hf.endswith(
        ("q_proj.weight", "k_proj.weight")
    ):
        return None
    return config.num_key_value_heads if "k_proj" in hf else config.num_attention_heads


def _dense(info: TensorInfo, raw: np.ndarray) -> torch.Tensor:
    """One tensor as float32 (rows, cols), or (cols,) for a 1-D one; exact for every type."""
    cols = info.dims[0]
    if info.type_id == _F32:
        out = torch.from_numpy(raw.copy().view(np.float32))
    elif info.type_id == _F16:
        out = torch.from_numpy(raw.copy().view(np.float16)).float()
    elif info.type_id == _BF16:
        out = torch.from_numpy(raw.copy().view(np.int16)).view(torch.bfloat16).float()
    elif info.type_id in gguf_blocks.BLOCK_TYPES:
        out = gguf_blocks.decode(info.type_id, raw).dequantize()
    else:  # the lookup-table formats (IQ*, TQ*): gguf-py's reference dequantizer
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(raw, GGMLQuantizationType(info.type_id))
        out = torch.from_numpy(values.astype(np.float32, copy=False))
    out = out.reshape(-1, cols)
    return out[0] if len(info.dims) == 1 else out


def read_dense(
    path: Path, config: PretrainedConfig, skip: Container[str] = ()
) -> dict[str, torch.Tensor]:
    """Every tensor the model loads, float32, by transformers name, except those in `skip`
    (linears the caller takes as codes from `read_quantized`).

    Raises GGUFFormatError naming a tensor no supported architecture has.
    """
    header = read_header(path)
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb") as file:
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    for info in header.tensors:
        hf = hf_tensor_name(info.name, header.architecture)
        if hf is None or hf in skip:
            continue
        tensor = _dense(info, raw_rows(data, header, info))
        heads = _permuted_heads(hf, header, config)
        if heads is not None:
            tensor = tensor[_unpermute_rows(tensor.shape[0], heads)]
        if header.architecture in NORM_SHIFTED and hf.endswith("norm.weight"):
            tensor = tensor - 1  # stored as 1 + w, the factor Gemma's RMSNorm scales by
        out[hf] = tensor
        _drop_pages(data, header, info)
    return out


def read_tensor(path: Path, gguf_name: str) -> torch.Tensor | None:
    """One tensor of the file by its GGUF name, float32 as stored (no renaming, no un-doing of
    llama.cpp's changes); None where the file has none of that name. For the few tensors that
    describe the config rather than the weights (Phi-3's RoPE factors)."""
    header = read_header(path)
    info = header.tensor(gguf_name)
    if info is None:
        return None
    with open(path, "rb") as file:
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return _dense(info, raw_rows(data, header, info))


def read_quantized(path: Path, config: PretrainedConfig) -> dict[str, GroupAffine]:
    """Every linear weight of the file in a block format with an exact integer form
    (`gguf_blocks`: Q4_0/1, Q5_0/1, Q8_0 and the K formats), by transformers parameter name,
    all decoded now (`FileCodes` decodes each when it is read)."""
    return FileCodes(path, config).materialize()


class FileCodes(MutableMapping[str, GroupAffine]):
    """The file's quantized linears by transformers name (as `read_quantized`), decoded from
    the mapped file each time one is read, so a load that packs them one linear at a time
    never holds every code at once (a 1B Q4_K_M model's codes, decoded to a byte each: 1.5 GB
    beside its 0.7 GB file). The parts of one fused linear (q/k/v, gate/up) decode together,
    and the last such group is kept, so reading its parts in turn decodes it once. Deleting a
    name forgets it (nothing is held for it); `formats` gives each linear's shape, width and
    groups without decoding.

    q/k rows are un-permuted for the files whose q/k rows llama.cpp permutes (`ROPE_PERMUTED`:
    "llama", which holds Mistral too, and "granite"; not Qwen, Phi-3, Gemma or OLMo 2). Phi-3's
    fused q/k/v and gate/up come as the fused linears' codes.
    """

    def __init__(self, path: Path, config: PretrainedConfig) -> None:
        self._header = header = read_header(path)
        self._config = config
        with open(path, "rb") as file:
            self._data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        # The parts of each fused linear (q/k/v, gate/up) by "<layer>.<fused name>", the rest
        # alone; each name's group
        self._groups: dict[str, list[tuple[str, TensorInfo]]] = {}
        self._group_of: dict[str, str] = {}
        for info in header.tensors:
            hf = hf_name(info.name, header.architecture)
            if hf is not None and info.type_id in gguf_blocks.BLOCK_TYPES:
                key = _fused_key(hf)
                self._groups.setdefault(key, []).append((hf, info))
                self._group_of[hf] = key
        self._last: tuple[str, dict[str, GroupAffine]] | None = None

    def __getitem__(self, name: str) -> GroupAffine:
        key = self._group_of[name]  # KeyError for a name the file lacks or was deleted
        if self._last is None or self._last[0] != key:
            self._last = None  # the previous group's codes go before the next's are made
            self._last = (key, self._decode(self._groups[key]))
        return self._last[1][name]

    def __setitem__(self, name: str, value: GroupAffine) -> None:
        raise TypeError("a file's codes are read from the file; they cannot be replaced")

    def __delitem__(self, name: str) -> None:
        key = self._group_of.pop(name)
        if self._last is not None and self._last[0] == key:
            self._last = None

    def __contains__(self, name: object) -> bool:
        return name in self._group_of  # Mapping's own would decode the codes to say so

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._group_of))

    def __len__(self) -> int:
        return len(self._group_of)

    def materialize(self) -> dict[str, GroupAffine]:
        """Every linear's codes, decoded now, each group once (its parts as row views of one
        matrix, so fusing them later copies nothing)."""
        out: dict[str, GroupAffine] = {}
        for key in dict.fromkeys(self._group_of.values()):
            decoded = self._decode(self._groups[key])
            out.update((name, codes) for name, codes in decoded.items() if name in self)
        return out

    def formats(self) -> dict[str, GroupAffine]:
        """Each linear's codes as shapes alone (tensors on the meta device), with the bits and
        groups they decode to: what the loader's plans read, without decoding anything."""
        out = {}
        for name, info in (m for members in self._groups.values() for m in members):
            if name not in self:
                continue
            kind = gguf_blocks.BLOCK_TYPES[info.type_id]
            rows, cols = _rows(info), info.dims[0]
            code_dtype = torch.uint8 if kind.bits == 4 else torch.int8
            out[name] = GroupAffine(
                torch.empty(rows, cols, dtype=code_dtype, device="meta"),
                torch.empty(rows, cols // kind.group, device="meta"),
                torch.empty(rows, cols // kind.group, device="meta"),
                bits=kind.bits,
                group=kind.group,
            )
        return out

    def _decode(self, members: list[tuple[str, TensorInfo]]) -> dict[str, GroupAffine]:
        """One group's codes: together where its parts share a block format and row width,
        else (Q4_K_M's Q6_K v beside Q4_K q, k) one by one."""
        data, header, config = self._data, self._header, self._config
        if len({(i.type_id, tensor_bytes(i) // _rows(i)) for _, i in members}) == 1:
            return _decode_together(data, header, config, members)
        out: dict[str, GroupAffine] = {}
        for member in members:
            out.update(_decode_together(data, header, config, [member]))
        return out


def _fused_key(hf: str) -> str:
    """The fused linear a transformers weight name is part of ("model.layers.3.mlp.gate_up_proj"
    for gate_proj and up_proj), or the name itself."""
    for fused, parts in FUSED_PARTS.items():
        for part in parts:
            if len(parts) > 1 and hf.endswith(f".{part}.weight"):
                return hf.removesuffix(f"{part}.weight") + fused
    return hf


def _rows(info: TensorInfo) -> int:
    return int(np.prod(info.dims[1:]))  # dims are innermost first: the rest are the rows


def _decode_together(
    data: mmap.mmap,
    header: GGUFHeader,
    config: PretrainedConfig,
    members: list[tuple[str, TensorInfo]],
) -> dict[str, GroupAffine]:
    """Tensors of one block format and row width decoded as one matrix, then given back as
    row views of it, so fusing them later (`GroupAffine.cat`) copies nothing."""
    raws = []
    for hf, info in members:
        raw = raw_rows(data, header, info)
        heads = _permuted_heads(hf, header, config)
        if heads is not None:
            # whole rows of blocks move, so permuting the raw bytes is exact and cheap
            raw = raw[_unpermute_rows(raw.shape[0], heads).numpy()]
        raws.append(raw)
    whole = gguf_blocks.decode(members[0][1].type_id, gguf_blocks.joined(raws))
    out, start = {}, 0
    for (hf, info), raw in zip(members, raws):
        out[hf] = whole.row_slice(start, start + raw.shape[0])
        start += raw.shape[0]
        _drop_pages(data, header, info)
    return out

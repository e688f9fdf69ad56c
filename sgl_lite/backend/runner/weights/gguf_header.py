"""The header of a GGUF file: its metadata, tensor entries and where the tensor data starts,
parsed from the memory-mapped file and checked, so a corrupt or truncated file is a
`GGUFFormatError` naming what is wrong (the tensor, for missing data) before any tensor is read.
This module reads no tensor data and knows nothing about models.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# GGUF metadata value types with a fixed size: type id → struct format
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8  # ggml's GGML_MAX_DIMS is 4; anything far above is a corrupt header


class GGUFFormatError(ValueError):
    """A file that is not a complete GGUF: bad magic, a corrupt header or truncated tensor data."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in the header: dims innermost first, as GGUF lists them."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed header of a GGUF file: scalar and string metadata, tensor entries, and where
    the tensor data starts. Array metadata (the vocabulary) is skipped, not decoded: only its
    length is kept, in `array_lengths`."""

    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_start: int
    header_digest: str  # sha256 of the header bytes: changes whenever metadata or layout does
    array_lengths: dict[str, int] = field(default_factory=dict)  # array metadata: its length

    @property
    def architecture(self) -> str:
        """`general.architecture` (e.g. "llama", "qwen2"); "" when the file names none."""
        return str(self.metadata.get("general.architecture", ""))

    def tensor(self, name: str) -> TensorInfo | None:
        """The entry of the tensor called `name` in the file (llama.cpp's name), or None."""
        return next((t for t in self.tensors if t.name == name), None)


class _Cursor:
    """Reads little-endian GGUF header fields from a memory-mapped file, bounds-checked."""

    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data, self.pos = data, 0
        self.array_length = 0  # the length of the last (outermost) array `value` skipped

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise GGUFFormatError("the header ends early (file truncated?)")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.data):
            raise GGUFFormatError("a header string runs past the end of the file")
        self.pos += n
        return bytes(self.data[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """One metadata value; arrays are skipped (None), everything else is returned."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"corrupt header: unknown value type {kind}")
        item, count = self.unpack("<I"), self.unpack("<Q")
        if item in _SCALARS:
            size = struct.calcsize(_SCALARS[item]) * count
            if self.pos + size > len(self.data):
                raise GGUFFormatError("a header array runs past the end of the file")
            self.pos += size
        elif item == _STRING:  # the vocabulary and merges: skipped by length, never decoded
            data, pos, end = self.data, self.pos, len(self.data)
            for _ in range(count):
                if pos + 8 > end:
                    raise GGUFFormatError("a header string array runs past the end of the file")
                pos += 8 + _U64.unpack_from(data, pos)[0]
            if pos > end:
                raise GGUFFormatError("a header string runs past the end of the file")
            self.pos = pos
        else:  # arrays of arrays: each item read (and skipped) in turn
            for _ in range(count):
                self.value(item)
        self.array_length = count
        return None


_U64 = struct.Struct("<Q")  # a header string's length


def tensor_bytes(info: TensorInfo) -> int:
    """How many bytes the tensor's data takes in the file (blocks of its ggml type)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type_id)]
    except (ValueError, KeyError):
        raise GGUFFormatError(
            f"tensor {info.name!r} has unknown ggml type {info.type_id}"
        ) from None
    return int(np.prod(info.dims)) // block * type_size


def _parse(data: mmap.mmap | bytes, check_data: bool) -> GGUFHeader:
    if bytes(data[:4]) != b"GGUF":
        raise GGUFFormatError("not a GGUF file (no GGUF magic)")
    cur = _Cursor(data)
    cur.pos = 4
    version, n_tensors, n_kv = cur.unpack("<I"), cur.unpack("<Q"), cur.unpack("<Q")
    if version < 2:
        raise GGUFFormatError(f"GGUF version {version} is not supported")
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(cur.unpack("<I"))
        if value is not None:
            metadata[key] = value
        else:
            array_lengths[key] = cur.array_length
    alignment = int(metadata.get("general.alignment") or 32)
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.unpack("<I")
        if n_dims > _MAX_DIMS:
            raise GGUFFormatError(f"corrupt header: tensor {name!r} has {n_dims} dimensions")
        dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
        infos.append(TensorInfo(name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    digest = hashlib.sha256(data[: cur.pos]).hexdigest()
    base = -(-cur.pos // alignment) * alignment
    if check_data:
        for info in infos:
            end = base + info.offset + tensor_bytes(info)
            if end > len(data):
                raise GGUFFormatError(
                    f"tensor {info.name!r} ends at byte {end} but the file has {len(data)} "
                    "bytes (truncated?)"
                )
    return GGUFHeader(metadata, tuple(infos), base, digest, array_lengths)


def read_header(path: Path, check_data: bool = True) -> GGUFHeader:
    """Parses the header of the GGUF file at `path`; with `check_data`, also checks that every
    tensor's bytes lie inside the file, so a truncated download is caught before any work.

    Raises GGUFFormatError (a ValueError) for anything that is not a complete GGUF file. The
    header is parsed here rather than with `gguf.GGUFReader`, which decodes every vocabulary
    string into Python objects and takes seconds for a 49k-token vocabulary. A load reads the
    header three times (checks, the conversion's fingerprint, the quantized codes), so parses
    are remembered per process by the file's identity (path, size, mtime): ~0.4 s each.
    """
    with open(path, "rb") as file:
        stat = os.fstat(file.fileno())
        if stat.st_size == 0:
            raise GGUFFormatError("the file is empty")
        key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, check_data)
        cached = _HEADERS.get(key)
        if cached is not None:
            return cached
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        header = _parse(data, check_data)
    finally:
        data.close()
    if len(_HEADERS) >= _MAX_HEADERS:
        _HEADERS.pop(next(iter(_HEADERS)))
    _HEADERS[key] = header
    return header


# Parsed headers by file identity; a handful of files at most in one process.
_HEADERS: dict[tuple[object, ...], GGUFHeader] = {}
_MAX_HEADERS = 8

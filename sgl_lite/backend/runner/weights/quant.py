"""Packed weight-only int4/int8 matrices on torch's CPU kernels, and group-affine weights.

`GroupAffine` is a quantized matrix as GGUF stores it: integer codes q (N, K) and, per row and
group of 32 columns, w = scale * q + offset (Q4_1: offset = min; Q4_0: offset = -8 * scale). It
maps exactly onto torch's `_weight_int4pack_mm_for_cpu`, whose dequantisation is
(q - 8) * scale + zero per group, with zero = offset + 8 * scale; only the rounding of scale and
zero to bf16 (the kernel's storage) differs from the file. The int8 kernel has one scale per
output row, so a finer-grained int8 source (Q8_0) is requantised per row (measured, not exact).

Both kernels are vectorised only for bf16 activations and return bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Protocol

import torch

GROUP = 32  # the int4 kernel's group size; the same as GGUF's Q4_x / Q8_0 blocks
INT_KINDS = ("int4", "int8")
# Our decoder's linears (by name inside a layer) and the checkpoint tensors stacked into each
FUSED_PARTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


@dataclass(frozen=True)
class GroupAffine:
    """Codes q (N, K) with w = scale * q + offset per row and group of `group` columns."""

    q: torch.Tensor  # (N, K) integer codes (uint8 for 4-bit, int8 for 8-bit)
    scale: torch.Tensor  # (N, K // group) float32
    offset: torch.Tensor  # (N, K // group) float32
    bits: int
    group: int = GROUP  # 32 for Q4_x/Q5_x/Q8_0 and the K formats' 32-wide sub-blocks; 16 for Q6_K
    # Where `cat` widened parts of different formats into this matrix (Q4_K_M's q and k beside
    # a Q6_K v), the parts as the file holds them: a kernel that takes each format runs each
    # run of like parts (`format_runs`) on half the bytes the widened 8-bit codes take.
    parts: tuple[GroupAffine, ...] = ()

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix (N, K) the codes stand for."""
        n, k = self.q.shape
        # In place into one float32 buffer: the same roundings as `q * scale + offset`, without
        # its two full-size temporaries (measured 10-40x faster on a 3072 x 576 matrix).
        out = torch.empty(n, k // self.group, self.group)
        out.copy_(self.q.view(n, k // self.group, self.group))
        return out.mul_(self.scale[..., None]).add_(self.offset[..., None]).view(n, k)

    def permute_rows(self, order: torch.Tensor) -> GroupAffine:
        """The same matrix with its rows reordered (groups run along rows, so this is exact)."""
        return GroupAffine(
            self.q.index_select(0, order),
            self.scale.index_select(0, order),
            self.offset.index_select(0, order),
            self.bits,
            self.group,
        )

    def widened(self, bits: int, group: int) -> GroupAffine:
        """The same matrix as `bits`-wide codes in groups of `group` (no wider, no coarser: 4-bit
        codes become the same values as 8-bit codes, and a group splits into smaller groups
        with the same scale and offset), so exactly the same weights."""
        if bits < self.bits or self.group % group:
            raise ValueError(
                f"cannot hold {self.bits}-bit codes in groups of {self.group} as "
                f"{bits}-bit codes in groups of {group}"
            )
        q = self.q if bits == self.bits else self.q.to(torch.int8)
        repeat = self.group // group
        scale, offset = self.scale, self.offset
        if repeat > 1:
            scale = scale.repeat_interleave(repeat, dim=1)
            offset = offset.repeat_interleave(repeat, dim=1)
        return GroupAffine(q, scale, offset, bits, group)

    @staticmethod
    def fused_format(parts: list[GroupAffine]) -> tuple[int, int]:
        """(bits, group) of `parts` stacked by `cat`: the widest codes, the finest groups."""
        return max(p.bits for p in parts), min(p.group for p in parts)

    def row_slice(self, start: int, stop: int) -> GroupAffine:
        """Rows [start, stop) as views (no copy)."""
        return GroupAffine(
            self.q[start:stop],
            self.scale[start:stop],
            self.offset[start:stop],
            self.bits,
            self.group,
        )

    @staticmethod
    def cat(parts: list[GroupAffine]) -> GroupAffine:
        """Rows of several matrices stacked (fused q/k/v or gate/up). Parts of different widths
        or groups (Q4_K beside Q6_K) are first widened to `fused_format`, which holds each
        exactly. Parts that are consecutive row slices of one matrix (`row_slice`: the GGUF
        reader decodes a fused linear's parts together) are joined without a copy."""
        bits, group = GroupAffine.fused_format(parts)
        mixed = any((p.bits, p.group) != (bits, group) for p in parts)
        wide = [p if (p.bits, p.group) == (bits, group) else p.widened(bits, group) for p in parts]
        return GroupAffine(
            _join_rows([p.q for p in wide]),
            _join_rows([p.scale for p in wide]),
            _join_rows([p.offset for p in wide]),
            bits,
            group,
            tuple(parts) if mixed else (),
        )

    def format_runs(self) -> list[GroupAffine]:
        """This matrix as runs of consecutive rows in one format each, stacked in order: the
        parts it was fused from, like neighbours joined (itself where it has one format)."""
        if not self.parts:
            return [self]
        runs = groupby(self.parts, key=lambda part: (part.bits, part.group))
        return [GroupAffine.cat(list(run)) for _, run in runs]


def _join_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors stacked by rows: a view where they are consecutive contiguous rows of one
    storage (a copy of a fused 1B model's codes took a quarter of its load), else a copy."""
    first = tensors[0]
    end = first.storage_offset()
    for t in tensors:
        same = t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same and t.is_contiguous() and t.storage_offset() == end):
            return torch.cat(tensors)
        end += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def check_shape(kind: str, out_features: int, in_features: int, name: str = "weight") -> None:
    """Raises ValueError unless torch's `kind` kernel can take a (N, K) weight.

    The int4 packer needs N % 16 == 0 and K % 32 == 0 (group size); the int8 kernel reads out of
    bounds (a segfault, seen with K = 31) unless K is a multiple of its vector width, so the same
    K % 32 rule is enforced for it.
    """
    problems = []
    if in_features % GROUP:
        problems.append(f"in_features={in_features} is not a multiple of {GROUP}")
    if kind == "int4" and out_features % 16:
        problems.append(f"out_features={out_features} is not a multiple of 16")
    if problems:
        raise ValueError(f"quantization={kind} cannot pack {name}: {'; '.join(problems)}")


# Int4Weight packs a matrix this many rows at a time. The kernel's layout is row-blocked (blocks
# of 64 rows, a tail of 16s last), so chunks of 256 give the whole matrix's bytes; and a chunk's
# int32 staging copy (4 bytes a code) is reused from the heap, where one the matrix's size is a
# fresh mapping faulted in for each matrix: 0.8 s of the embedded model's load, measured.
_PACK_ROWS = 256
_int4pack = torch.ops.aten._convert_weight_to_int4pack_for_cpu


@dataclass(frozen=True)
class Int4Weight:
    """A matrix packed for `_weight_int4pack_mm_for_cpu` at group size 32."""

    packed: torch.Tensor
    scale_zeros: torch.Tensor  # (K // GROUP, N, 2) bf16: per group scale and zero
    shape: tuple[int, int]
    input_dtype = torch.bfloat16  # the kernel is vectorised for bf16 activations only

    @classmethod
    def from_affine(cls, w: GroupAffine) -> Int4Weight:
        """Packs 4-bit codes (0..15) exactly; only scale and zero are rounded to bf16."""
        if w.bits != 4 or w.group != GROUP:
            raise ValueError(
                f"int4 packing needs 4-bit codes in groups of {GROUP}, got {w.bits}-bit codes "
                f"in groups of {w.group}"
            )
        n, k = w.q.shape
        check_shape("int4", n, k)
        # (K // GROUP, N, 2) written in place, rounded to bf16 once (no stacked float copy)
        scale_zeros = torch.empty(k // GROUP, n, 2, dtype=torch.bfloat16)
        scale_zeros[..., 0].copy_(w.scale.t())
        scale_zeros[..., 1].copy_((w.offset + 8 * w.scale).t())
        packed = torch.empty(n, k // 2, dtype=torch.uint8)
        for start in range(0, n, _PACK_ROWS):
            rows = w.q[start : start + _PACK_ROWS].to(torch.int32)  # the kernel takes int32 codes
            packed[start : start + _PACK_ROWS] = _int4pack(rows, 1)
        return cls(packed, scale_zeros, (n, k))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int4Weight:
        """Round-to-nearest per group of 32 between the group's min and max (asymmetric)."""
        return cls.from_affine(affine_int4(weight))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, K) bf16 → (T, N) bf16."""
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scale_zeros)

    @staticmethod
    def kernel_matrix(w: GroupAffine) -> torch.Tensor:
        """The float32 matrix the kernel multiplies by when packed from `w`: the file's codes
        with scale and zero rounded to bf16 as the kernel stores them."""
        n, k = w.q.shape
        scale = w.scale.to(torch.bfloat16).float()
        zero = (w.offset + 8 * w.scale).to(torch.bfloat16).float()
        groups = (w.q.view(n, k // GROUP, GROUP).float() - 8) * scale[..., None]
        return (groups + zero[..., None]).view(n, k)


@dataclass(frozen=True)
class Int8Weight:
    """A matrix for `_weight_int8pack_mm`: int8 codes with one bf16 scale per output row."""

    q: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) bf16
    input_dtype = torch.bfloat16

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Weight:
        """Symmetric per-row round-to-nearest."""
        n, k = weight.shape
        check_shape("int8", n, k)
        weight = weight.float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)
        q = (weight / scales.float()[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q, scales)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, K) bf16 → (T, N) bf16."""
        return torch._weight_int8pack_mm(x, self.q, self.scales)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix the kernel multiplies by."""
        return self.q.float() * self.scales.float()[:, None]

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        rows, cols = self.q.shape
        return rows, cols


class PackedWeight(Protocol):
    """What a linear needs of a packed matrix (torch's kernels here, onnxruntime's in
    ort_nbits): its (out, in) shape, the activation dtype its kernel takes, and the product."""

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        ...

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype `matmul` takes and returns."""
        ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, in) → (T, out), both in `input_dtype`."""
        ...


def affine_int4(weight: torch.Tensor) -> GroupAffine:
    """4-bit asymmetric codes per group of 32 spanning each group's [min, max]."""
    n, k = weight.shape
    check_shape("int4", n, k)
    groups = weight.float().view(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
    return GroupAffine(q.view(n, k), scale, low, bits=4)


def quantize(weight: torch.Tensor, kind: str) -> Int4Weight | Int8Weight:
    """A float matrix (N, K) packed for the `kind` kernel."""
    if kind == "int4":
        return Int4Weight.from_float(weight)
    if kind == "int8":
        return Int8Weight.from_float(weight)
    raise ValueError(f"quantization kind must be one of {', '.join(INT_KINDS)}, got {kind!r}")

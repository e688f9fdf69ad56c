"""Packs a loaded model's linears for the int kernels, at load (packed layouts are CPU-specific,
so nothing packed is ever written to disk).

Each decoder linear gets a packed copy (the file's own 4-bit codes where it has them, our
round-to-nearest codes otherwise) and the LM head an 8-bit copy. Two kernels take them:
torch's int4pack/int8pack (`quant`) and onnxruntime's MatMulNBits (`ort_nbits`, which keeps the
file's Q8_0 head codes exactly where torch's int8 kernel requantizes them per row). In the
deterministic mode the kernels run every pass, so `install` frees the dense float weights; in
the fast mode long passes still run them, so they stay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.linear import Linear
from sgl_lite.backend.runner.weights.quant import (
    FUSED_PARTS,
    GroupAffine,
    Int4Weight,
    Int8Weight,
    PackedWeight,
    affine_int4,
    check_shape,
)

KERNELS = ("torch", "onnxruntime")
HEAD = "model.embed_tokens.weight"  # a tied head's own codes; an untied one is lm_head's


@dataclass(frozen=True)
class PackReport:
    """What packing did: how long it took and the memory it holds."""

    seconds: float
    packed_bytes: int
    dense_bytes: int  # the float32 linears (and untied head) freed by `install`
    from_file: int  # linears packed from the file's own codes (no requantisation)
    total: int

    def describe(self, kept_dense: bool = False) -> str:
        """One phrase for the start-up line."""
        where = "beside" if kept_dense else "in place of"
        return (
            f"packed {self.total} linears ({self.from_file} from the file's codes) in "
            f"{self.seconds:.1f}s: {self.packed_bytes / 2**20:.0f} MB packed {where} "
            f"{self.dense_bytes / 2**20:.0f} MB of float32 linears"
        )


def _linears(model: Any):  # a LlamaForCausalLM (not imported: it imports this package)
    for i, layer in enumerate(model.layers):
        for ours in FUSED_PARTS:
            module, attr = ours.split(".")
            yield i, ours, getattr(getattr(layer, module), attr)


def shape_problem(model: Any, kind: str) -> str | None:
    """Why `kind` cannot pack this model's linears, or None if it can."""
    for i, name, linear in _linears(model):
        try:
            check_shape(kind, linear.out_features, linear.in_features, f"layer {i} {name}")
        except ValueError as exc:
            return str(exc)
    return None


def _nbytes(packed: PackedWeight) -> int:
    if isinstance(packed, ort_nbits.OrtNBitsWeight):
        n, k = packed.shape
        return n * k * packed.bits // 8 + n * (k // 32) * 5  # codes, scales, zero points
    if isinstance(packed, Int4Weight):
        tensors = (packed.packed, packed.scale_zeros)
    elif isinstance(packed, Int8Weight):
        tensors = (packed.q, packed.scales)
    else:
        raise TypeError(f"unknown packed weight {type(packed).__name__}")
    return sum(t.numel() * t.element_size() for t in tensors)


def _pack_one(
    weight: torch.Tensor,
    kind: str,
    affine: GroupAffine | None,
    kernel: str,
    threads: int,
) -> PackedWeight:
    """`weight` packed for `kind` on `kernel`; from the file's codes `affine` when given."""
    if kernel == "onnxruntime":
        if affine is None:
            affine = affine_int4(weight) if kind == "int4" else _affine_int8(weight)
        return ort_nbits.OrtNBitsWeight.from_affine(affine, threads)
    if kind == "int8":
        return Int8Weight.from_float(weight)
    return Int4Weight.from_affine(affine if affine is not None else affine_int4(weight))


def _affine_int8(weight: torch.Tensor) -> GroupAffine:
    """Symmetric 8-bit codes per group of 32 (Q8_0's rule), for a float matrix."""
    n, k = weight.shape
    check_shape("int8", n, k)
    groups = weight.float().view(n, k // 32, 32)
    scale = (groups.abs().amax(-1) / 127).clamp(min=1e-12)
    q = (groups / scale[..., None]).round().clamp(-127, 127).to(torch.int8)
    return GroupAffine(q.view(n, k), scale, torch.zeros_like(scale), bits=8)


def _part_names(quantized: Mapping[str, GroupAffine], layer: int, name: str) -> list[str] | None:
    """The checkpoint names of fused linear `name`'s parts in `layer`, or None where the file
    lacks codes for any of them. A file that holds the linear fused already (Phi-3's q/k/v and
    gate/up) names it as its one part."""
    whole = f"model.layers.{layer}.{name}.weight"
    parts = (whole,) if whole in quantized else FUSED_PARTS[name]
    names = [p if p == whole else f"model.layers.{layer}.{p}.weight" for p in parts]
    return names if all(n in quantized for n in names) else None


def _file_parts(
    quantized: Mapping[str, GroupAffine], layer: int, name: str, bits: int | None
) -> list[GroupAffine] | None:
    """The file's own codes of fused linear `name`'s parts in `layer` (`bits` wide, or of any
    width for None), or None where the file lacks any of them."""
    names = _part_names(quantized, layer, name)
    if names is None:
        return None
    parts = [quantized[n] for n in names]
    return parts if all(bits in (None, p.bits) for p in parts) else None


def dense_from_codes_names(
    model: Any, quantized: Mapping[str, GroupAffine], codes_only: list[str]
) -> list[str]:
    """The checkpoint names of the decoder linears' parts whose dense weight
    `fill_dense_from_codes` builds from the file's codes, rather than the file being decoded a
    second time and the parts fused again in float32: every linear with codes for all its
    parts, except those that run from their codes alone (`codes_only`)."""
    skip = set(codes_only)
    names: list[str] = []
    for i, name, _ in _linears(model):
        parts = _part_names(quantized, i, name)
        if parts is not None and skip.isdisjoint(parts):
            names += parts
    return names


def fill_dense_from_codes(
    model: Any, quantized: Mapping[str, GroupAffine], names: list[str]
) -> None:
    """Gives each decoder linear whose parts are in `names` (loaded as meta placeholders) the
    float32 matrix of its fused codes: the values the file's dense read would give, bit for bit
    (the same codes, the same scale * q + offset), in one dequantization of the fused linear."""
    wanted = set(names)
    for i, name, linear in _linears(model):
        parts = _part_names(quantized, i, name)
        if parts is None or not wanted.issuperset(parts):
            continue
        dense = GroupAffine.cat([quantized[n] for n in parts]).dequantize()
        linear.weight = torch.nn.Parameter(dense, requires_grad=False)


def _file_codes(
    quantized: Mapping[str, GroupAffine], layer: int, name: str, bits: int | None
) -> GroupAffine | None:
    """Fused linear `name` of `layer` from the file's own codes (`bits` wide, or whatever the
    file holds for None: parts of different formats widened to one, exactly), or None where
    the file lacks any of its parts."""
    parts = _file_parts(quantized, layer, name, bits)
    return GroupAffine.cat(parts) if parts is not None else None


def _file_formats(model: Any, quantized: Mapping[str, GroupAffine]) -> list[tuple[int, int] | None]:
    """Per fused decoder linear, the (bits, group) its file codes take once fused
    (`GroupAffine.fused_format`), or None where it has none."""
    formats: list[tuple[int, int] | None] = []
    for i, name, _ in _linears(model):
        parts = _file_parts(quantized, i, name, None)
        formats.append(None if parts is None else GroupAffine.fused_format(parts))
    return formats


def file_kind(model: Any, quantized: Mapping[str, GroupAffine]) -> str | None:
    """The int kernel kind that holds every decoder linear of the file exactly: "int4" where
    each is 4-bit codes in groups of 32 (Q4_0, Q4_1, Q4_K), "int8" where each has integer codes
    of some width (Q5_x, Q6_K, Q8_0, and the mixed files llama.cpp writes: Q4_K_M is Q4_K
    beside Q6_K), None where any linear has no integer form in the file (float, IQ formats)."""
    formats = _file_formats(model, quantized)
    if not formats or None in formats:
        return None
    return "int4" if set(formats) == {(4, 32)} else "int8"


def file_formats(model: Any, quantized: Mapping[str, GroupAffine]) -> str:
    """The decoder linears' codes in words, for the start-up line: "60 4-bit/32, 30 8-bit/16"."""
    counts: dict[tuple[int, int], int] = {}
    for fused in _file_formats(model, quantized):
        if fused is not None:
            counts[fused] = counts.get(fused, 0) + 1
    return ", ".join(f"{n} {b}-bit/{g}" for (b, g), n in sorted(counts.items()))


class LinearCodes(MutableMapping[str, GroupAffine]):
    """Each decoder linear's block codes by "<layer>.<linear>" (see `exact_codes`), made when
    read: the file's own, its parts fused (of different formats: each exactly, in runs), or
    rounded from the float weight at `bits` where the file has none. Deleting a linear (as
    `pop` does) with `consume` takes its parts out of `quantized` too."""

    def __init__(
        self, model: Any, bits: int, quantized: MutableMapping[str, GroupAffine], consume: bool
    ) -> None:
        self._linears = {f"{i}.{name}": (i, name, linear) for i, name, linear in _linears(model)}
        self._bits, self._quantized, self._consume = bits, quantized, consume

    def __getitem__(self, key: str) -> GroupAffine:
        i, name, linear = self._linears[key]
        # The file's codes as they are (4- or 8-bit, groups of 16 or 32: MatMulNBits takes
        # each), rounded from the float weights only where the file has none.
        affine = _file_codes(self._quantized, i, name, None)
        if affine is None:
            weight = linear.weight.detach()
            affine = affine_int4(weight) if self._bits == 4 else _affine_int8(weight)
        return affine

    def __setitem__(self, key: str, value: GroupAffine) -> None:
        raise TypeError("a linear's codes come from the file or its weight; not set")

    def __delitem__(self, key: str) -> None:
        i, name, _ = self._linears.pop(key)
        if self._consume:
            for part in (name, *FUSED_PARTS[name]):
                self._quantized.pop(f"model.layers.{i}.{part}.weight", None)

    def __contains__(self, key: object) -> bool:
        return key in self._linears  # Mapping's own would make the codes to say so

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._linears))

    def __len__(self) -> int:
        return len(self._linears)


def exact_codes(
    model: Any, kind: str, quantized: MutableMapping[str, GroupAffine], consume: bool = False
) -> tuple[MutableMapping[str, GroupAffine], GroupAffine]:
    """Block codes for onnxruntime's MatMulNBits: each decoder linear's by "<layer>.<linear>"
    (`LinearCodes`) and the head's (8 bits), the file's own where it has them, else rounded
    from the float weights at `kind`'s width (the rule `pack_model` follows for that kernel).
    Without `consume` every linear's are made now. With it they are made as they are taken
    (`pop`), each linear's parts then taken out of `quantized`: from a `FileCodes`, no more
    than one linear's codes are ever decoded and fused at once (a load's peak memory)."""
    codes = LinearCodes(model, {"int4": 4, "int8": 8}[kind], quantized, consume)
    source = model.embed_tokens.weight if model.tied else model.lm_head.weight
    head = quantized.get(HEAD if model.tied else "lm_head.weight")
    if head is None or head.bits != 8:
        head = _affine_int8(source.detach())
    return (codes if consume else dict(codes)), head


def drop_dense_linears(model: Any) -> None:
    """Frees the dense weights of every decoder linear and of an untied head (their codes run
    elsewhere: the onnxruntime graph); each keeps an empty weight of the model's dtype, so
    `.to(dtype)` and state listings keep working."""
    linears = [linear for _, _, linear in _linears(model)]
    if model.lm_head is not None:
        linears.append(model.lm_head)
    for linear in linears:
        linear.drop_dense()


@dataclass
class PackedModel:
    """Packed copies of a model's linears, not yet installed (so a failed probe changes nothing)."""

    linears: list[tuple[Linear, PackedWeight]]
    head: PackedWeight | None  # None: the head stays dense
    report: PackReport
    kernel: str

    def probe_pairs(self) -> list[tuple[PackedWeight, torch.Tensor]]:
        """(packed, dense) of every layer's largest linear, for timing the kernels (before
        install: the dense weights are still there)."""
        widest = max(linear.in_features * linear.out_features for linear, _ in self.linears[:4])
        return [
            (packed, linear.weight.detach())
            for linear, packed in self.linears
            if linear.in_features * linear.out_features == widest
        ]

    def install(self, model: Any, keep_dense: bool) -> None:
        """Gives each linear (and the head) its packed copy; frees the dense weights unless
        `keep_dense` (the fast mode's long passes run them)."""
        for linear, packed in self.linears:
            linear.packed = packed
            if not keep_dense:
                linear.drop_dense()
        model.head_packed = self.head
        if model.lm_head is not None and not keep_dense:  # untied: its dense copy goes too
            model.lm_head.drop_dense()


def pack_model(
    model: Any,
    kind: str,
    quantized: Mapping[str, GroupAffine],
    kernel: str = "torch",
    threads: int = 1,
    widest_only: bool = False,
    head_kernel: str | None = "same",
    reuse: PackedModel | None = None,
    codes: MutableMapping[str, GroupAffine] | None = None,
) -> PackedModel:
    """Packs every decoder linear and the LM head for `kind` on `kernel` (see the module doc).

    `quantized` holds the file's own codes by transformers name (empty for a float checkpoint);
    4-bit codes are packed exactly for int4 (8-bit codes, the head's among them, exactly on
    onnxruntime), anything else is quantized from the float weight. `widest_only` packs just
    each layer's largest linear, for timing the kernels against each other before packing all.
    `head_kernel` packs the LM head for another kernel ("same": `kernel`; None: the head stays
    dense). `reuse` is an earlier probe's packing on the same kernels: its linears (and its
    head) are taken as they are. `codes` are `exact_codes`' for `kind`, where the caller has
    them already (the fused linears' codes are then not concatenated again). Raises
    RuntimeError if a kernel's packing fails on this build.
    """
    head_kernel = kernel if head_kernel == "same" else head_kernel
    for name in (kernel, head_kernel or kernel):
        if name not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {name!r}")
    start = time.perf_counter()
    packed_bytes = dense_bytes = from_file = 0
    linears = []
    done = {id(linear): packed for linear, packed in reuse.linears} if reuse else {}
    widest = max(linear.in_features * linear.out_features for _, _, linear in _linears(model))
    for i, name, linear in _linears(model):
        if widest_only and linear.in_features * linear.out_features != widest:
            continue
        # torch's int8 kernel has one scale per row, so only its int4 kernel (4-bit codes in
        # groups of 32) and onnxruntime's MatMulNBits (any of the file's codes) take them as
        # they are.
        bits = 4 if kernel == "torch" else None
        exact = kind == "int4" or kernel == "onnxruntime"
        from_file += exact and _file_parts(quantized, i, name, bits) is not None
        packed = done.get(id(linear))
        if packed is None:
            affine = None
            if exact:
                affine = codes[f"{i}.{name}"] if codes else _file_codes(quantized, i, name, bits)
            packed = _pack_one(linear.weight.detach(), kind, affine, kernel, threads)
        linears.append((linear, packed))
        packed_bytes += _nbytes(packed)
        dense_bytes += linear.weight.numel() * 4  # float32 until the model is cast
    source = model.embed_tokens.weight if model.tied else model.lm_head.weight
    if not model.tied:
        dense_bytes += source.numel() * 4
    # The head stays 8-bit even in int4 mode: GGUF files keep it at 8 bits or finer.
    head_codes = quantized.get(HEAD if model.tied else "lm_head.weight")
    head: PackedWeight | None = None
    if reuse is not None and reuse.head is not None and reuse.kernel == head_kernel:
        head = reuse.head
    elif head_kernel is not None:
        file_codes = head_codes if head_codes is not None and head_codes.bits == 8 else None
        head = _pack_one(source.detach(), "int8", file_codes, head_kernel, threads)
    if head is not None:
        packed_bytes += _nbytes(head)
    report = PackReport(
        time.perf_counter() - start, packed_bytes, dense_bytes, from_file, len(linears)
    )
    return PackedModel(linears, head, report, kernel)

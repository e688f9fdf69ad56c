"""Packs a loaded model's linears for the int kernels, at load (packed layouts are CPU-specific,
so nothing packed is ever written to disk).

Each decoder linear gets a packed copy (the file's own 4-bit codes where it has them, our
round-to-nearest codes otherwise) and the LM head an int8 copy. Once installed, the kernels run
every pass (see formats), so the dense float weights of the linears are freed: the model then
holds the packed bytes, the embedding and the norms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sgl_lite.backend.runner.weights.linear import Linear
from sgl_lite.backend.runner.weights.quant import (
    GroupAffine,
    Int4Weight,
    Int8Weight,
    PackedWeight,
    affine_int4,
    check_shape,
)

# Fused linear of our model → the transformers weights it stacks, in order.
FUSED_PARTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


@dataclass(frozen=True)
class PackReport:
    """What packing did: how long it took and the memory it holds."""

    seconds: float
    packed_bytes: int
    dense_bytes: int  # the float32 linears (and untied head) freed by `install`
    from_file: int  # linears packed from the file's own codes (no requantisation)
    total: int

    def describe(self) -> str:
        """One phrase for the start-up line."""
        return (
            f"packed {self.total} linears ({self.from_file} from the file's codes) in "
            f"{self.seconds:.1f}s: {self.packed_bytes / 2**20:.0f} MB packed in place of "
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
    tensors = (
        (packed.packed, packed.scale_zeros)
        if isinstance(packed, Int4Weight)
        else (packed.q, packed.scales)
    )
    return sum(t.numel() * t.element_size() for t in tensors)


def _pack_one(weight: torch.Tensor, kind: str, affine: GroupAffine | None) -> PackedWeight:
    """`weight` packed for `kind`; int4 from the file's codes `affine` when given."""
    if kind == "int8":
        return Int8Weight.from_float(weight)
    return Int4Weight.from_affine(affine if affine is not None else affine_int4(weight))


@dataclass
class PackedModel:
    """Packed copies of a model's linears, not yet installed (so a failed probe changes nothing)."""

    linears: list[tuple[Linear, PackedWeight]]
    head: Int8Weight
    report: PackReport

    def probe_pairs(self) -> list[tuple[PackedWeight, torch.Tensor]]:
        """(packed, dense) of every layer's largest linear, for `time_packed` (before install:
        the dense weights are still there)."""
        widest = max(linear.in_features * linear.out_features for linear, _ in self.linears[:4])
        return [
            (packed, linear.weight.detach())
            for linear, packed in self.linears
            if linear.in_features * linear.out_features == widest
        ]

    def install(self, model: Any) -> None:
        """Gives each linear (and the head) its packed copy and frees the dense weights."""
        for linear, packed in self.linears:
            linear.packed = packed
            # An empty weight, not None: `.to(dtype)` and state listings keep working.
            linear.weight = nn.Parameter(torch.empty(0, linear.in_features), requires_grad=False)
        model.head_packed = self.head
        if model.lm_head is not None:  # untied: the head's own dense copy goes too
            model.lm_head.weight = nn.Parameter(torch.empty(0), requires_grad=False)


def pack_model(model: Any, kind: str, quantized: dict[str, GroupAffine]) -> PackedModel:
    """Packs every decoder linear and the LM head for `kind` (see the module doc).

    `quantized` holds the file's own codes by transformers name (empty for a float checkpoint);
    4-bit codes are packed exactly for int4, anything else is quantized from the float weight.
    Raises RuntimeError if torch's packing op fails on this build.
    """
    start = time.perf_counter()
    packed_bytes = dense_bytes = from_file = 0
    linears = []
    for i, name, linear in _linears(model):
        parts = [quantized.get(f"model.layers.{i}.{p}.weight") for p in FUSED_PARTS[name]]
        affine = None
        if kind == "int4" and all(p is not None and p.bits == 4 for p in parts):
            affine = GroupAffine.cat(parts)  # type: ignore[arg-type]
            from_file += 1
        packed = _pack_one(linear.weight.detach(), kind, affine)
        linears.append((linear, packed))
        packed_bytes += _nbytes(packed)
        dense_bytes += linear.weight.numel() * 4  # float32 until the model is cast
    source = model.embed_tokens.weight if model.tied else model.lm_head.weight
    if not model.tied:
        dense_bytes += source.numel() * 4
    # The head stays int8 even in int4 mode: GGUF files keep it at 8 bits or finer.
    head = Int8Weight.from_float(source.detach())
    packed_bytes += _nbytes(head)
    report = PackReport(
        time.perf_counter() - start, packed_bytes, dense_bytes, from_file, len(linears)
    )
    return PackedModel(linears, head, report)

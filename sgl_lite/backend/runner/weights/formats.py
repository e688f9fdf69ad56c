"""Which weight format a model runs in: `dtype` and `quantization` resolved against the file and
the CPU, with the reason in words for the start-up line.

With an int kind, every pass (prefill and decode, any batch) runs the packed int kernels: a
token's K/V must not depend on which pass computed it, or greedy output with the radix cache on
and off parts at near-ties (a dense prefill and an int decode round differently, and the bf16
cast at each kernel's input turns a last-bit difference into a 0.4 % one). torch's int4/int8 CPU
kernels are row-invariant (a row's result does not depend on the other rows; the runner checks
this at load), the norms, RoPE and SwiGLU are row-wise, and attention, whose float32 result
depends on the padding and the query count of the pass, runs in float64 (`attn_dtype`) so its
float32 rounding comes out the same. No dense copy of the linears is kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sgl_lite.backend.runner.weights.cpu import CpuCaps

logger = logging.getLogger("sgl_lite")

DTYPE_CHOICES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")
# Attention of the int modes: float64 differences (summation order, padding) sit ~2^-29 below
# float32's rounding step, so the float32 result is the same in every pass (measured: K/V and
# logits bitwise equal prefill vs decode vs padded batch on the embedded model).
EXACT_ATTN_DTYPE = torch.float64


@dataclass(frozen=True)
class WeightFormat:
    """The resolved format: activation/dense dtype, int kernel for every pass (or None), the
    dtype attention runs in (None: the activations'), and why."""

    dense_dtype: torch.dtype
    int_kind: str | None
    reason: str
    attn_dtype: torch.dtype | None = None

    def dense_only(self, dense: torch.dtype, dense_reason: str, why: str) -> WeightFormat:
        """Dense `dense` weights (chosen for `dense_reason`) without the int kernels, and why
        they were dropped."""
        return WeightFormat(dense, None, f"{dense_reason}; {self.int_kind} dropped: {why}")

    def describe(self) -> str:
        """`int4 kernels for every pass, float32 activations, float64 attention (why...)`."""
        dense = str(self.dense_dtype).removeprefix("torch.")
        if self.int_kind is None:
            return f"{dense} ({self.reason})"
        attn = str(self.attn_dtype or self.dense_dtype).removeprefix("torch.")
        return (
            f"{self.int_kind} kernels for every pass, {dense} activations, {attn} attention "
            f"({self.reason})"
        )


def resolve_dense_dtype(dtype: str, device: str, caps: CpuCaps | None) -> tuple[torch.dtype, str]:
    """`dtype` (auto|float32|bfloat16|float16) → torch dtype and the reason."""
    if dtype != "auto":
        if dtype not in DTYPE_CHOICES:
            raise ValueError(
                f"dtype must be auto or one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}"
            )
        chosen = DTYPE_CHOICES[dtype]
        if caps is not None and chosen is not torch.float32 and not caps.fast_bf16:
            # Allowed (it is correct), but say plainly that it will be slow here.
            logger.warning(
                "dtype=%s on a %s CPU: no native %s GEMM, batched matmuls run several times "
                "slower than float32",
                dtype,
                caps.describe(),
                dtype,
            )
        return chosen, f"dtype={dtype} requested"
    if device.startswith("cuda"):
        return torch.bfloat16, "CUDA"
    if caps is not None and caps.fast_bf16:
        return torch.bfloat16, f"CPU {caps.describe()}"
    return torch.float32, f"CPU {caps.describe() if caps else device}"


def resolve_format(
    *,
    dtype: str,
    quantization: str,
    device: str,
    caps: CpuCaps | None,
    file_kind: str | None,
) -> WeightFormat:
    """Resolves the user's `dtype` and `quantization` for this model and machine.

    `file_kind` is the int kernel that matches the checkpoint's own quantization ("int4" for a
    GGUF of Q4_x layers), or None for a float checkpoint; `auto` never quantizes coarser than
    the file. The runner then packs, checks and times the kernels (`cpu.rows_invariant`,
    `cpu.time_packed`) and, for `auto`, keeps them only if they are row-invariant and win
    (`dense_only`). Raises ValueError for a request that cannot run
    here.
    """
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {quantization!r}"
        )
    dense, dense_reason = resolve_dense_dtype(dtype, device, caps)
    on_cuda = device.startswith("cuda")
    if quantization in ("int4", "int8") and on_cuda:
        raise ValueError(
            f"quantization={quantization} runs on torch's CPU kernels only; on CUDA use "
            "quantization=none (bf16 weights)"
        )
    if quantization == "none" or (quantization == "auto" and (on_cuda or file_kind is None)):
        why = (
            "quantization=none"
            if quantization == "none"
            else "CUDA runs dense weights"
            if on_cuda
            else "no int-kernel format in the file"
        )
        return WeightFormat(dense, None, f"{dense_reason}; {why}")
    kind = quantization if quantization != "auto" else file_kind
    if dtype == "auto":
        # Between the kernels the activations stay float32: the only rounding to bf16 is at
        # each kernel's input, on values that are the same in every pass.
        dense, dense_reason = torch.float32, "activations float32 between the kernels"
    source = "the file's own weights" if quantization == "auto" else "requested"
    source += ", one kernel for every pass so a token's K/V never depends on the pass"
    return WeightFormat(dense, kind, f"{source}; {dense_reason}", EXACT_ATTN_DTYPE)

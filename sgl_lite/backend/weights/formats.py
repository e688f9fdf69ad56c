"""Which weight format a model runs in: `dtype` and `quantization` resolved against the file and
the CPU, with the reason in words for the start-up line.

Two paths share one set of weights. Passes of at most `int_max_tokens` tokens (decode of small
batches) run the packed int kernels with bf16 activations, where streaming 4 or 8 bits per weight
wins; larger passes (prefill, big batches) run dense `dense_dtype` GEMMs over the same weights
dequantized once at load, where compute, not memory, bounds the time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sgl_lite.backend.weights.cpu import CpuCaps

logger = logging.getLogger("sgl_lite")

DTYPE_CHOICES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")
# Measured (2 threads, SmolLM2 shapes): the int kernels grow linearly with the token count; a
# bf16 oneDNN GEMM (AVX512-BF16/AMX) is nearly flat and wins from ~8 tokens, float32 (no bf16
# GEMM, e.g. AVX2-only EPYC) only from ~16.
INT_MAX_TOKENS_BF16_CPU = 4
INT_MAX_TOKENS_F32_CPU = 16


@dataclass(frozen=True)
class WeightFormat:
    """The resolved format: dense dtype, int kernel for small passes (or None), and why."""

    dense_dtype: torch.dtype
    int_kind: str | None
    int_max_tokens: int
    reason: str

    def dense_only(self, why: str) -> WeightFormat:
        """The same dense dtype without int kernels, and why they were dropped."""
        return WeightFormat(self.dense_dtype, None, 0, f"{self.reason}; {why}")

    def describe(self) -> str:
        """`int4 for passes <= 16 tokens, float32 dense otherwise (why...)`."""
        dense = str(self.dense_dtype).removeprefix("torch.")
        if self.int_kind is None:
            return f"{dense} ({self.reason})"
        return (
            f"{self.int_kind} for passes <= {self.int_max_tokens} tokens, {dense} dense "
            f"otherwise ({self.reason})"
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
    the file. The runner then packs and times the kernels (`cpu.time_packed`) and, for `auto`,
    keeps them only if they win (`dense_only`). Raises ValueError for a request that cannot run
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
        return WeightFormat(dense, None, 0, f"{dense_reason}; {why}")
    kind = quantization if quantization != "auto" else file_kind
    max_tokens = INT_MAX_TOKENS_BF16_CPU if dense is torch.bfloat16 else INT_MAX_TOKENS_F32_CPU
    if caps is not None and caps.fast_bf16 and dense is torch.float32:
        max_tokens = INT_MAX_TOKENS_F32_CPU
    source = "the file's own weights" if quantization == "auto" else "requested"
    return WeightFormat(dense, kind, max_tokens, f"{source}; {dense_reason}")

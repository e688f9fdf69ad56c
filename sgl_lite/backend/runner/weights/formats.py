"""Which weight format a model runs in: `dtype`, `quantization` and the mode resolved against the
file and the CPU, with the reason in words for the start-up line.

Two modes, as in SGLang:

- **Fast (the default).** The file's own quantization where it has one (never coarser), on the
  fastest kernel this CPU has (`kernels`), for the passes it wins: decode steps and short
  passes of up to `int_max_rows` rows. Longer passes (prefill, large batches) run the dense
  weights (dequantized from the file once, at load) through the CPU's GEMM. Attention runs in
  the activations' dtype. A token's K/V may then differ in its last bits between a prefill and
  a decode pass, so greedy output with the radix cache on and off can part at near-ties; the
  mode is held to per-token agreement with float32 and a perplexity bound instead. A request
  sent again repeats, though: a prompt's last token is always computed in a pass of single
  tokens (`passes.split_final_rows`), as the repeat whose whole prompt is cached
  computes it, so the second run gives the first one's tokens.
- **Deterministic (`enable_deterministic_inference`).** Batch- and pass-invariant numerics:
  greedy output is identical with the cache on and off, alone and batched. With an int file,
  every pass runs torch's packed int kernels (row-invariant, checked at load: a row's result
  does not depend on the other rows), and attention, whose float32 result depends on the
  padding and the query count of the pass, runs in float64 (`attn_dtype`) so its float32
  rounding comes out the same. No dense copy of the linears is kept. A float checkpoint runs in
  float64 throughout, since the CPU's float32 GEMM gives a row other bits alone than in a batch
  (measured with MKL: 1 row vs 40).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from sgl_lite.backend.runner.weights.cpu import CpuCaps, dense_gemm_probe

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


# Fast mode: passes of up to this many rows (decode batches, short chunks) run the packed
# kernels, longer ones the dense GEMM. A provisional bound: the runner replaces it at load with
# the row count up to which the chosen kernel measured faster than the GEMM (choose._crossover;
# 8-16 on an AVX-512 EPYC for torch's int4 kernel against bf16).
FAST_INT_MAX_ROWS = 32


@dataclass(frozen=True)
class WeightFormat:
    """The resolved format: activation/dense dtype, the int kernel's kind (or None), which
    passes run it, the dtype attention runs in (None: the activations'), and why."""

    dense_dtype: torch.dtype
    int_kind: str | None
    reason: str
    attn_dtype: torch.dtype | None = None
    # None: every pass runs the int kernels (deterministic); else passes of up to this many rows.
    int_max_rows: int | None = None
    deterministic: bool = False
    kernel: str = "torch"  # which int kernels: "torch" (int4pack/int8pack) or "onnxruntime"

    def dense_only(self, dense: torch.dtype, dense_reason: str, why: str) -> WeightFormat:
        """Dense `dense` weights (chosen for `dense_reason`) without the int kernels, and why
        they were dropped."""
        return WeightFormat(
            dense,
            None,
            f"{dense_reason}; {self.int_kind} dropped: {why}",
            deterministic=self.deterministic,
        )

    def with_kernel(self, kernel: str, why: str) -> WeightFormat:
        """The same format on another int kernel, and why it was chosen."""
        return replace(self, kernel=kernel, reason=f"{self.reason}; {why}")

    def runs_int(self, rows: int) -> bool:
        """Whether a pass of `rows` rows runs the packed int kernels."""
        return self.int_kind is not None and (
            self.int_max_rows is None or rows <= self.int_max_rows
        )

    def describe(self) -> str:
        """`fast mode: int4 kernels (onnxruntime) for passes of <= 32 rows, ... (why...)`."""
        dense = str(self.dense_dtype).removeprefix("torch.")
        mode = "deterministic mode" if self.deterministic else "fast mode"
        if self.int_kind is None:
            return f"{mode}: {dense} ({self.reason})"
        attn = str(self.attn_dtype or self.dense_dtype).removeprefix("torch.")
        passes = (
            "every pass"
            if self.int_max_rows is None
            else f"passes of <= {self.int_max_rows} rows, dense {dense} GEMM above"
        )
        return (
            f"{mode}: {self.int_kind} kernels ({self.kernel}) for {passes}, {dense} "
            f"activations, {attn} attention ({self.reason})"
        )


def resolve_dense_dtype(
    dtype: str, device: str, caps: CpuCaps | None, prefill_only: bool = False
) -> tuple[torch.dtype, str]:
    """`dtype` (auto|float32|bfloat16|float16) → torch dtype and the reason. `auto` is bf16 on
    CUDA and on a CPU with bf16 GEMM instructions, float32 on any other CPU; but where the dense
    GEMM serves only prompt chunks and wide batches (`prefill_only`: decode runs int kernels),
    float32 wherever its GEMM measured faster than bf16's here (`cpu.dense_gemm_probe`).
    Dense-only weights keep bf16 there: their decode streams every weight, and bf16 halves
    the bytes (SmolLM2 without int kernels on a Xeon with AVX512-BF16 and no AMX, 2 threads:
    a 1-row step 38-43 ms in bf16, 43-53 in float32; 8 rows 60-65 vs 89-98)."""
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
        probe = dense_gemm_probe() if prefill_only else None
        if probe is not None and probe.float32_wins:
            return torch.float32, f"CPU {caps.describe()}; {probe.describe()}"
        return torch.bfloat16, f"CPU {caps.describe()}"
    return torch.float32, f"CPU {caps.describe() if caps else device}"


def resolve_format(
    *,
    dtype: str,
    quantization: str,
    device: str,
    caps: CpuCaps | None,
    file_kind: str | None,
    deterministic: bool = False,
    dense_copy: bool = True,
) -> WeightFormat:
    """Resolves the user's `dtype`, `quantization` and mode for this model and machine.

    `file_kind` is the int kernel that matches the checkpoint's own quantization ("int4" for a
    GGUF of Q4_x layers), or None for a float checkpoint; `auto` never quantizes coarser than
    the file. The runner then packs, checks and times the kernels (`cpu.rows_invariant`,
    `kernels.choose_kernel`) and, for `auto`, keeps them only where they win (`dense_only`).
    `dense_copy` is False where every pass will run the file's codes (no dense GEMM to time).
    Raises ValueError for a request that cannot run here, naming what to change.
    """
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {quantization!r}"
        )
    on_cuda = device.startswith("cuda")
    if deterministic:
        _check_deterministic(dtype, on_cuda)
    dense, dense_reason = resolve_dense_dtype(dtype, device, caps)
    if quantization in ("int4", "int8") and on_cuda:
        raise ValueError(
            f"quantization={quantization} runs on CPU kernels only; on CUDA use "
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
        if deterministic:
            return WeightFormat(
                torch.float64,
                None,
                f"{why}; float64 throughout: the float32 GEMM is not row-invariant",
                deterministic=True,
            )
        return WeightFormat(dense, None, f"{dense_reason}; {why}")
    kind = quantization if quantization != "auto" else file_kind
    source = "the file's own weights" if quantization == "auto" else "requested"
    if deterministic:
        if dtype == "auto":
            # Between the kernels the activations stay float32: the only rounding to bf16 is at
            # each kernel's input, on values that are the same in every pass.
            dense, dense_reason = torch.float32, "activations float32 between the kernels"
        source += ", one kernel for every pass so a token's K/V never depends on the pass"
        return WeightFormat(
            dense, kind, f"{source}; {dense_reason}", EXACT_ATTN_DTYPE, deterministic=True
        )
    if dtype == "auto" and dense_copy:  # the dense GEMM serves long passes only
        dense, dense_reason = resolve_dense_dtype(dtype, device, caps, prefill_only=True)
    return WeightFormat(dense, kind, f"{source}; {dense_reason}", int_max_rows=FAST_INT_MAX_ROWS)


def _check_deterministic(dtype: str, on_cuda: bool) -> None:
    """Refuses the settings whose kernels cannot keep the deterministic guarantee."""
    if on_cuda:
        raise ValueError(
            "enable_deterministic_inference is implemented for the CPU kernels only "
            "(cuBLAS GEMMs are not batch-invariant); run without it on CUDA"
        )
    if dtype in ("bfloat16", "float16"):
        raise ValueError(
            f"enable_deterministic_inference cannot keep its guarantee with dtype={dtype}: "
            "the CPU's bf16/fp16 GEMM gives a row other bits alone than in a batch; "
            "use dtype=auto or float32"
        )

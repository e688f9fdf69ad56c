"""What this CPU can do fast, probed at run time (the machines behind a deployment change).

torch's int4/int8 weight-only kernels are vectorised only for bf16 activations, and a dense
bf16 GEMM is fast only with AVX512-BF16 or AMX; without those a batched bf16 `linear` is several
times slower than float32. So the choice of formats rests on two facts: whether the CPU has a
bf16 GEMM path, and whether a packed int matmul actually beats a dense one here, which we time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgl_lite.backend.weights import quant


@dataclass(frozen=True)
class CpuCaps:
    """The CPU's vector ISA as torch reports it, and whether it has a fast bf16 GEMM."""

    isa: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", ...
    avx512_bf16: bool
    amx: bool

    @property
    def fast_bf16(self) -> bool:
        """True where oneDNN runs bf16 GEMMs natively (AVX512-BF16 or AMX)."""
        return self.avx512_bf16 or self.amx

    def describe(self) -> str:
        """One phrase for the start-up line."""
        extras = [name for name, on in (("AVX512-BF16", self.avx512_bf16), ("AMX", self.amx)) if on]
        return self.isa + (f"+{'+'.join(extras)}" if extras else " (no bf16 GEMM)")


def cpu_caps() -> CpuCaps:
    """Probes the CPU this process runs on."""
    return CpuCaps(
        isa=torch.backends.cpu.get_cpu_capability(),
        avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
        amx=bool(torch.cpu._is_amx_tile_supported()),
    )


@dataclass(frozen=True)
class KernelTiming:
    """One timed batch-1 matmul on a model-sized weight: packed int vs dense, in microseconds."""

    kind: str
    int_us: float
    dense_us: float
    error: str | None = None

    @property
    def wins(self) -> bool:
        """The packed kernel ran and beat the dense one by a clear margin."""
        return self.error is None and self.int_us * 1.2 < self.dense_us

    def describe(self) -> str:
        """`int4 41us vs float32 95us` or the failure."""
        if self.error:
            return f"{self.kind} kernel failed: {self.error}"
        return f"{self.kind} {self.int_us:.0f}us vs dense {self.dense_us:.0f}us at batch 1"


def _best_of(fn: Callable[[], object], repeats: int = 15) -> float:
    fn()  # the first call may allocate or pick a kernel
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def time_int_kernel(
    kind: str, out_features: int, in_features: int, dense: torch.dtype
) -> KernelTiming:
    """Runs and times one packed matmul of the given shape against the dense one.

    A weight several MB large is used so the timing reflects streaming weights from memory the
    way a decode step does, not a cache-resident toy; a failure (kernel missing on this build)
    is reported, not raised, so the caller can fall back.
    """
    weight = torch.randn(out_features, in_features) * 0.02
    x = torch.randn(1, in_features)
    try:
        packed = quant.quantize(weight, kind)
        xb = x.bfloat16()
        int_us = _best_of(lambda: packed.matmul(xb))
    except (RuntimeError, ValueError) as exc:
        return KernelTiming(kind, float("inf"), 0.0, error=str(exc).splitlines()[0][:200])
    w_dense, x_dense = weight.to(dense), x.to(dense)
    dense_us = _best_of(lambda: F.linear(x_dense, w_dense))
    return KernelTiming(kind, int_us, dense_us)

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

from sgl_lite.backend.runner.weights import quant


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
    """One batch-1 pass over a model's packed linears against the same pass dense, in ms."""

    kind: str
    int_ms: float
    dense_ms: float

    @property
    def wins(self) -> bool:
        """The packed kernels are faster than the dense matmuls.

        Measured margins where the kernels are vectorised: 1.6x (AVX2, one thread) to 3x; where
        they are not (float activations, an ISA torch has no kernel for) they lose 12-27x. The
        probe only has to tell those apart, so no margin is asked for: a margin would make the
        choice flip with the load of a shared machine.
        """
        return self.int_ms < self.dense_ms

    def describe(self) -> str:
        """`int4 3.1ms vs dense 9.8ms over 30 layers' gate_up at batch 1`."""
        return f"{self.kind} {self.int_ms:.1f}ms vs dense {self.dense_ms:.1f}ms per probe pass"


def _best_of_each(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Best times of two passes in ms, interleaved so both see the same load, in CPU time of
    this thread: on a shared machine wall time counts the other processes' turns (a busy
    machine once made the int4 pass look slower than dense and `auto` dropped it)."""
    first(), second()  # the first call may allocate or pick a kernel
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, fn in enumerate((first, second)):
            start = time.thread_time()
            fn()
            best[i] = min(best[i], time.thread_time() - start)
    return best[0] * 1e3, best[1] * 1e3


def time_packed(
    kind: str,
    pairs: list[tuple[quant.PackedWeight, torch.Tensor]],
    dense: torch.dtype,
    repeats: int = 7,
) -> KernelTiming:
    """Times one batch-1 pass over the model's own (packed, dense) weights, each way.

    The model's weights, not a toy matrix: a single matrix sits in the L2/L3 cache, where a
    dense float32 GEMV looks as fast as the int kernel; a decode step streams every weight from
    memory, and so does a pass over all of them. One thread, timed in CPU time: a
    multi-threaded timing on a busy machine measures the other processes (OpenMP waits for its
    slowest thread), not the kernel.
    Raises RuntimeError if the kernel fails.
    """
    width = pairs[0][1].shape[1]
    x = torch.randn(1, width)
    xb, xd = x.bfloat16(), x.to(dense)
    weights = (
        [w.to(dense) for _, w in pairs] if dense is not torch.float32 else [w for _, w in pairs]
    )

    def packed_pass() -> None:
        for packed, _ in pairs:
            packed.matmul(xb)

    def dense_pass() -> None:
        for w in weights:
            F.linear(xd, w)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return KernelTiming(kind, *_best_of_each(packed_pass, dense_pass, repeats))
    finally:
        torch.set_num_threads(threads)


def rows_invariant(packed: quant.PackedWeight, rows: int = 40) -> bool:
    """Whether the kernel gives each row the same bits alone as in a batch of `rows`.

    The int modes' cache on/off guarantee rests on it (see formats). Measured true for torch's
    int4/int8 CPU kernels on AVX2 for 1..512 rows; a build whose kernel switches algorithm with
    the row count (blocked GEMM for large M) would fail here, and `auto` then runs dense.
    Checked in split batches too (1, then rows - 1), the shapes of a decode beside a prefill.
    """
    x = torch.randn(rows, packed.shape[1], generator=torch.Generator().manual_seed(0))
    x = x.bfloat16()
    whole = packed.matmul(x)
    alone = torch.cat([packed.matmul(x[i : i + 1]) for i in range(rows)])
    split = torch.cat([packed.matmul(x[:1]), packed.matmul(x[1:])])
    return torch.equal(whole, alone) and torch.equal(whole, split)

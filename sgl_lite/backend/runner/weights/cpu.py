"""What this CPU can do fast, probed at run time (the machines behind a deployment change).

torch's int4/int8 weight-only kernels are vectorised only for bf16 activations, and a dense
bf16 GEMM is fast only with AVX512-BF16 or AMX; without those a batched bf16 `linear` is several
times slower than float32. Having the instructions is not enough either: on a Xeon with
AVX512-BF16 and no AMX, oneDNN's bf16 GEMM ran a prompt chunk 1.6-1.7x slower than its float32
one (`dense_gemm_probe`). So the choice of formats rests on three facts: whether the CPU has a
bf16 GEMM path, whether that path beats float32's here, and whether a packed int matmul beats a
dense one here; the last two we time.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgl_lite.backend.runner.weights import onednn, quant


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


# The dense GEMM the bf16-or-float32 probe times: a 256-row prompt chunk through a 1024-wide
# layer. Prefill is where the fast mode runs the dense GEMM (decode passes run the int kernels);
# one thread, like every probe here. Measured fp32 / bf16 speed on a Xeon with AVX512-BF16 and
# no AMX, 1 thread: 1.59 at 128 rows, 1.66 at 256, 1.70 at 512 (1.74 on SmolLM2's 1536 x 576).
PROBE_ROWS, PROBE_WIDTH = 256, 1024
# bf16 gives way to float32 only where float32's GEMM is at least this much faster: near a tie
# the CPU's bf16 instructions decide, so a noisy probe does not flip the mode (and with it the
# numerics) from one start to the next. AMX runs bf16 several times faster than float32.
FLOAT32_MARGIN = 1.25


@dataclass(frozen=True)
class GemmProbe:
    """One thread's best time for the probe's dense GEMM in bf16 (oneDNN's prepacked layout,
    as the runner runs it) and in float32, in ms."""

    bf16_ms: float
    float32_ms: float

    @property
    def float32_wins(self) -> bool:
        """float32's GEMM beats bf16's here by FLOAT32_MARGIN or more."""
        return self.bf16_ms >= FLOAT32_MARGIN * self.float32_ms

    def describe(self) -> str:
        """`bf16 GEMM 1.66x float32's time here (6.6 vs 4.0 ms, 256-row probe)`."""
        return (
            f"bf16 GEMM {self.bf16_ms / self.float32_ms:.2f}x float32's time here "
            f"({self.bf16_ms:.1f} vs {self.float32_ms:.1f} ms, {PROBE_ROWS}-row probe)"
        )


@functools.cache
def dense_gemm_probe() -> GemmProbe | None:
    """Times the dense GEMM in bf16 against float32 on this CPU, once per process (never kept
    on disk: the next process may run on another CPU); None where bf16 cannot be prepacked."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, PROBE_WIDTH, generator=generator)
    weight = torch.randn(PROBE_WIDTH, PROBE_WIDTH, generator=generator) * 0.02
    packed = onednn.prepack(weight.to(torch.bfloat16))
    if packed is None:
        return None
    xb = x.to(torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ms = _best_of_each(
            {"bf16": lambda: onednn.linear(xb, packed), "float32": lambda: F.linear(x, weight)},
            repeats=5,
        )
    finally:
        torch.set_num_threads(threads)
    return GemmProbe(ms["bf16"], ms["float32"])


@dataclass(frozen=True)
class KernelTiming:
    """One batch-1 pass over a model's linears on each candidate kernel and dense, in ms."""

    kind: str
    ms: dict[str, float]  # kernel name (or "dense") → best pass time

    @property
    def fastest(self) -> str:
        """The fastest candidate, "dense" included.

        Measured margins where the kernels are vectorised: 1.6x (AVX2, one thread) to 3x; where
        they are not (float activations, an ISA torch has no kernel for) they lose 12-27x. The
        probe only has to tell those apart, so no margin is asked for: a margin would make the
        choice flip with the load of a shared machine.
        """
        return min(self.ms, key=self.ms.__getitem__)

    @property
    def wins(self) -> bool:
        """Some packed kernel is faster than the dense matmuls."""
        return self.fastest != "dense"

    def describe(self) -> str:
        """`int4 onnxruntime 1.2ms, torch 3.1ms vs dense 9.8ms per probe pass`."""
        kernels = ", ".join(f"{k} {v:.1f}ms" for k, v in self.ms.items() if k != "dense")
        return f"{self.kind} {kernels} vs dense {self.ms['dense']:.1f}ms per probe pass"


def _best_of_each(passes: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time of each pass in ms, interleaved so all see the same load, in CPU time of
    this process: on a shared machine wall time counts the other processes' turns (a busy
    machine once made the int4 pass look slower than dense and `auto` dropped it); the
    process's, not the thread's, because onnxruntime runs part of a pass on its own pool."""
    for fn in passes.values():
        fn()  # the first call may allocate or pick a kernel
    best = dict.fromkeys(passes, float("inf"))
    for _ in range(repeats):
        for name, fn in passes.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def time_kernels(
    kind: str,
    candidates: dict[str, list[quant.PackedWeight]],
    dense_weights: list[torch.Tensor],
    dense: torch.dtype,
    repeats: int = 7,
    rows: int = 1,
) -> KernelTiming:
    """Times one pass of `rows` rows over the model's own weights on each kernel and dense.

    The model's weights, not a toy matrix: a single matrix sits in the L2/L3 cache, where a
    dense float32 GEMV looks as fast as the int kernel; a decode step streams every weight from
    memory, and so does a pass over all of them. One thread, timed in CPU time: a
    multi-threaded timing on a busy machine measures the other processes (OpenMP waits for its
    slowest thread), not the kernel.
    Raises RuntimeError (or onnxruntime's error) if a kernel fails.
    """
    width = dense_weights[0].shape[1]
    x = torch.randn(rows, width)
    weights = [w.to(dense) for w in dense_weights] if dense is not torch.float32 else dense_weights
    # The dense GEMM as the runner will run it: from oneDNN's layout where it uses that.
    prepacked = [onednn.prepack(w) for w in weights]
    xd = x.to(dense)

    def packed_pass(packed: list[quant.PackedWeight]) -> Callable[[], None]:
        inputs = {p.input_dtype: x.to(p.input_dtype) for p in packed}

        def run() -> None:
            for p in packed:
                p.matmul(inputs[p.input_dtype])

        return run

    def dense_pass() -> None:
        for w, p in zip(weights, prepacked):
            F.linear(xd, w) if p is None else onednn.linear(xd, p)

    passes: dict[str, Callable[[], object]] = {
        name: packed_pass(packed) for name, packed in candidates.items()
    }
    passes["dense"] = dense_pass
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return KernelTiming(kind, _best_of_each(passes, repeats))
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
    x = x.to(packed.input_dtype)
    whole = packed.matmul(x)
    alone = torch.cat([packed.matmul(x[i : i + 1]) for i in range(rows)])
    split = torch.cat([packed.matmul(x[:1]), packed.matmul(x[1:])])
    return torch.equal(whole, alone) and torch.equal(whole, split)

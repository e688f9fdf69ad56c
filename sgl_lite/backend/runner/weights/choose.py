"""Chooses and installs a loaded model's weight format: the mode, the int kernel, the dtype.

After the weights are read (`codes_plan` said which linears load as the file's codes alone),
`prepare_weights` resolves the settings (formats), packs the linears for each candidate kernel,
checks and times them on this CPU, installs the winner and, in the fast mode, builds the
onnxruntime decode step (`graph_step`); every fallback is logged with its reason, and only an
explicit request that cannot run here raises.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_loader import ModelLoadError
from sgl_lite.backend.runner.ort_step import OrtDecodeStep
from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.codes_plan import DENSE_LINEARS_ENV, CodesPlan, code_formats
from sgl_lite.backend.runner.weights.cpu import CpuCaps, cpu_caps, rows_invariant, time_kernels
from sgl_lite.backend.runner.weights.formats import (
    WeightFormat,
    resolve_dense_dtype,
    resolve_format,
)
from sgl_lite.backend.runner.weights.graph_step import (
    build_decode_step,
    graph_beside,
    ort_step_blocker,
)
from sgl_lite.backend.runner.weights.packing import (
    PackedModel,
    drop_dense_linears,
    exact_codes,
    file_formats,
    pack_model,
    shape_problem,
)
from sgl_lite.backend.runner.weights.packing import file_kind as packed_file_kind
from sgl_lite.backend.runner.weights.quant import GroupAffine

if TYPE_CHECKING:
    from sgl_lite.backend.runner.models.llama import LlamaForCausalLM

logger = logging.getLogger("sgl_lite")

# A kernel whose batch-1 output parts from the dense product by more than this (relative
# norm) is broken on this build, not merely rounding (measured: 5e-3 for MatMulNBits with int8
# activations, 3e-3 for torch's int4 kernel with bf16 ones).
MAX_KERNEL_ERROR = 0.05


class PreparedWeights(NamedTuple):
    """What `prepare_weights` installed: the format, a note for the start-up line, and the
    fast mode's onnxruntime decode step (None: decode steps run on torch)."""

    format: WeightFormat
    note: str
    decode_step: OrtDecodeStep | None = None


def prepare_weights(
    model: LlamaForCausalLM,
    folder: Path,
    config: EngineConfig,
    device: torch.device,
    quantized: MutableMapping[str, GroupAffine],
    plan: CodesPlan | None = None,
) -> PreparedWeights:
    """Resolves the format for this file and machine, packs and installs the int kernels it
    uses (and, in the fast mode, builds the onnxruntime decode step); returns what it installed.
    `quantized` is `read_file_codes`' answer; `plan` is `codes_only_linears`': where it names
    the decoder linears, they were loaded without dense weights and every pass runs their
    codes. Raises
    ValueError for settings that cannot run here (an explicit quantization, or the
    deterministic mode's guarantee)."""
    on_cpu = device.type == "cpu"
    caps = cpu_caps() if on_cpu else None
    formats = code_formats(quantized)  # nothing decoded for these
    file_kind = packed_file_kind(model, formats) if quantized else None
    kind = config.quantization if config.quantization in ("int4", "int8") else file_kind
    problem = shape_problem(model, kind) if kind and on_cpu else None
    note = f"; the file's linears: {file_formats(model, formats)}" if file_kind else ""
    plan = plan or CodesPlan([], "")
    note += plan.note
    if problem and config.quantization == "auto":
        file_kind, note = None, f"; int kernels skipped: {problem}"
    elif problem:
        raise ValueError(problem)
    deterministic = config.enable_deterministic_inference
    fmt = resolve_format(
        dtype=config.dtype,
        quantization=config.quantization,
        device=device.type,
        caps=caps,
        file_kind=file_kind,
        deterministic=deterministic,
        dense_copy=not plan.names,
    )
    if fmt.int_kind is None:
        return PreparedWeights(fmt, note)
    threads = config.num_threads or torch.get_num_threads()
    if deterministic:
        return PreparedWeights(*_install_deterministic(model, fmt, quantized, config, note))
    if plan.names:
        return _install_codes_only(model, fmt, quantized, threads, note)
    key = (str(folder), kind, config.dtype, config.quantization, threads)
    # The fused linears' block codes once, for torch's int4 packing and the onnxruntime step.
    codes = exact_codes(model, fmt.int_kind, quantized) if _wants_codes(model, fmt) else None
    kind = fmt.int_kind
    assert kind is not None
    fmt, note = _install_fast(model, fmt, quantized, config, caps, threads, note, key, codes)
    if fmt.int_kind is None and not quantized:  # the probes dropped the int kernels
        return PreparedWeights(fmt, note)
    # The decode step runs the file's own codes whether or not torch's int kernels beat the
    # dense GEMM for the other short passes (the whole step as one graph is what wins there).
    rows, in_groups = graph_beside(fmt.dense_dtype)
    step, step_note = build_decode_step(model, kind, quantized, threads, codes, max_rows=rows)
    if step is not None and in_groups:
        step.decode_groups = True
        step_note += f", larger ones in groups of {step.max_rows}"
    # In the format's reason, so the start-up line and /get_server_info say which step runs.
    return PreparedWeights(replace(fmt, reason=fmt.reason + step_note), note, step)


def _wants_codes(model: LlamaForCausalLM, fmt: WeightFormat) -> bool:
    """Whether the fast mode will read the fused linears' exact codes: torch's int4 packing
    does, and so does the onnxruntime step where it can run."""
    return fmt.int_kind == "int4" or ort_step_blocker(model) is None


def _install_codes_only(
    model: LlamaForCausalLM,
    fmt: WeightFormat,
    quantized: MutableMapping[str, GroupAffine],
    threads: int,
    note: str,
) -> PreparedWeights:
    """Every pass on the file's codes, with no dense copy of a linear: as one onnxruntime graph
    (the decode step's, which then takes prefill chunks too) where the model's block is one it
    builds, else each linear (and the head) as its own `MatMulNBits` session. Raises
    ModelLoadError when a kernel fails its check here (the dense weights it would fall back
    to were never read)."""
    kind = fmt.int_kind
    assert kind is not None
    codes = exact_codes(model, kind, quantized, consume=True)
    fmt = replace(fmt, int_max_rows=None).with_kernel("onnxruntime", "no dense copy of the linears")
    # Where the graph cannot express the model, `build_decode_step` says so before touching `codes`
    # (they then feed the per-linear sessions below); once it starts, it owns them.
    step, step_note = build_decode_step(model, kind, quantized, threads, codes, consume=True)
    if step is not None:
        step.every_pass = True
        drop_dense_linears(model)
        note += "; every pass on the graph"
        return PreparedWeights(replace(fmt, reason=fmt.reason + step_note), note, step)
    packed = pack_model(model, kind, quantized, "onnxruntime", threads, codes=codes[0])
    why = _codes_problem(packed, codes[0])
    if why:
        raise ModelLoadError(
            f"onnxruntime's MatMulNBits fails its check on this file's codes ({why}); "
            f"set {DENSE_LINEARS_ENV}=1 to run the dense weights"
        )
    packed.install(model, keep_dense=False)
    report = packed.report
    note += (
        f"; packed {report.total} linears from the file's codes in {report.seconds:.1f}s: "
        f"{report.packed_bytes / 2**20:.0f} MB"
    )
    return PreparedWeights(replace(fmt, reason=fmt.reason + step_note), note)


def _codes_problem(packed: PackedModel, codes: MutableMapping[str, GroupAffine]) -> str | None:
    """Why the first packed linear's product parts from its codes' exact one, or None."""
    linear, weight = packed.linears[0]
    affine = next(iter(codes.values()))
    x = torch.randn(2, linear.in_features, generator=torch.Generator().manual_seed(0))
    got = weight.matmul(x.to(weight.input_dtype)).float()
    want = x @ affine.dequantize().t()
    error = float((got - want).norm() / want.norm())
    if not error < MAX_KERNEL_ERROR:  # NaN included
        return f"its product is off by {error:.1%}"
    return None


def _install_deterministic(
    model: LlamaForCausalLM,
    fmt: WeightFormat,
    quantized: MutableMapping[str, GroupAffine],
    config: EngineConfig,
    note: str,
) -> tuple[WeightFormat, str]:
    """torch's int kernels on every pass, checked row-invariant; the dense weights freed."""
    kind = fmt.int_kind
    assert kind is not None
    try:
        packed = pack_model(model, kind, quantized, "torch")
        invariant = rows_invariant(packed.probe_pairs()[0][0])
    except RuntimeError as exc:  # the kernel is missing or fails on this build/CPU
        if config.quantization != "auto":
            raise ValueError(f"quantization={config.quantization} cannot run here: {exc}") from exc
        return fmt.dense_only(torch.float64, "float64 throughout", f"kernel failed: {exc}"), note
    if not invariant:
        raise ValueError(
            f"enable_deterministic_inference cannot keep its guarantee here: torch's {kind} "
            "kernel gives a row other bits alone than in a batch on this CPU; run without it"
        )
    packed.install(model, keep_dense=False)
    return fmt, f"{note}; kernels row-invariant; {packed.report.describe()}"


class KernelChoice(NamedTuple):
    """What the fast mode's probes chose on this machine, and the timings behind it."""

    kernel: str  # the layers' int kernel
    head_kernel: str | None  # the head's (None: dense)
    max_rows: int  # passes up to this many rows run the int kernels
    why: str
    dense_dtype: torch.dtype


# Probes and timings are per machine and per process: a second engine on the same file and
# settings in this process (tests, a server's restart of its engine) reuses the choice
# instead of timing again. Nothing is written to disk (the CPU may differ next time).
_CHOICES: dict[tuple[object, ...], KernelChoice] = {}


def _install_fast(
    model: LlamaForCausalLM,
    fmt: WeightFormat,
    quantized: MutableMapping[str, GroupAffine],
    config: EngineConfig,
    caps: CpuCaps | None,
    threads: int,
    note: str,
    key: tuple[object, ...],
    codes: tuple[MutableMapping[str, GroupAffine], GroupAffine] | None = None,
) -> tuple[WeightFormat, str]:
    """The fastest int kernel for the layers and, apart, for the head, on the passes where it
    beats the dense GEMM; the dense weights stay for the longer passes. `codes`: the fused
    linears' exact codes, where already read."""
    linear_codes = codes[0] if codes else None
    kind = fmt.int_kind
    assert kind is not None
    choice, probe, head = _CHOICES.get(key), None, None
    if choice is None:
        probes: dict[str, PackedModel] = {}
        # NOTE: onnxruntime only for a 1-thread engine. Called between torch's ops in a 2-thread
        # engine it cost the step more than its kernel saved (W4 batch 1 on an AVX-512 EPYC:
        # 27 tok/s with its head, 51 with its pool at 1 thread, 60 without it; at 1 thread 55
        # with it vs 47 without): torch's OpenMP team sleeps and wakes around each foreign call.
        kernels = ("onnxruntime", "torch") if threads == 1 else ("torch",)
        for kernel in kernels:
            why = _probe(model, kind, quantized, kernel, threads, probes, linear_codes)
            if why:
                logger.info("sgl_lite weights: %s kernel not used: %s", kernel, why)
                note += f"; {kernel} kernel not used: {why}"
        found = _choose(model, fmt, probes, config)
        if isinstance(found, str):
            if config.quantization != "auto":
                raise ValueError(f"quantization={config.quantization} cannot run here: {found}")
            dense, dense_reason = resolve_dense_dtype(config.dtype, "cpu", caps)
            return fmt.dense_only(dense, dense_reason, found), note
        choice = _CHOICES[key] = found
        probe = probes[choice.kernel]
        head = probes[choice.head_kernel].head if choice.head_kernel else None
    head_kernel = None if head is not None else choice.head_kernel
    full = pack_model(
        model,
        kind,
        quantized,
        choice.kernel,
        threads,
        head_kernel=head_kernel,
        reuse=probe,
        codes=linear_codes,
    )
    full.head = head or full.head
    full.install(model, keep_dense=True)
    fmt = replace(fmt, int_max_rows=choice.max_rows, dense_dtype=choice.dense_dtype)
    return fmt.with_kernel(choice.kernel, choice.why), f"{note}; {full.report.describe(True)}"


def _choose(
    model: LlamaForCausalLM,
    fmt: WeightFormat,
    probes: dict[str, PackedModel],
    config: EngineConfig,
) -> KernelChoice | str:
    """Times the probed kernels against the dense GEMM: the choice, or why none is used."""
    if not probes:
        return "no int kernel runs here"
    dense_layers = [w for _, w in next(iter(probes.values())).probe_pairs()]
    layers = time_kernels(
        fmt.int_kind or "int",
        {name: [p for p, _ in packed.probe_pairs()] for name, packed in probes.items()},
        dense_layers,
        fmt.dense_dtype,
    )
    if config.quantization == "auto" and not layers.wins:
        return f"{layers.describe()}: dense is faster"
    kernel = min(probes, key=layers.ms.__getitem__)
    head_source = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    heads = {name: packed.head for name, packed in probes.items() if packed.head is not None}
    head = time_kernels(
        "8-bit head",
        {name: [packed] for name, packed in heads.items()},
        [head_source.detach()],
        fmt.dense_dtype,
        repeats=3,
    )
    dense = fmt.dense_dtype
    if kernel == "onnxruntime" and config.dtype == "auto":
        # Its kernel takes float32: float32 activations need no cast around each linear.
        dense = torch.float32
    why = f"layers: {layers.describe()}; head: {head.describe()}"
    head_kernel = head.fastest if head.wins else None
    return KernelChoice(kernel, head_kernel, _crossover(probes[kernel], dense), why, dense)


# Row counts at which the fast mode compares the int kernel with the dense GEMM at load.
CROSSOVER_ROWS = (2, 4, 8, 16, 32, 64)


def _crossover(probe: PackedModel, dense: torch.dtype) -> int:
    """The most rows for which the packed kernel still beats the dense GEMM on this CPU (the
    fast mode's `int_max_rows`), over ten layers' widest linears: at 1 row it streams a
    quarter of the bytes, while from some batch on the dense GEMM's arithmetic wins."""
    pairs = probe.probe_pairs()[:10]
    packed = [p for p, _ in pairs]
    dense_weights = [w for _, w in pairs]
    best = 1
    for rows in CROSSOVER_ROWS:
        timing = time_kernels(
            "int", {probe.kernel: packed}, dense_weights, dense, repeats=3, rows=rows
        )
        if not timing.wins:
            break
        best = rows
    return best


def _probe(
    model: LlamaForCausalLM,
    kind: str,
    quantized: MutableMapping[str, GroupAffine],
    kernel: str,
    threads: int,
    probes: dict[str, PackedModel],
    codes: MutableMapping[str, GroupAffine] | None = None,
) -> str | None:
    """Packs each layer's widest linear for `kernel` and checks it against the dense product;
    adds it to `probes`, or returns why the kernel cannot be used."""
    if kernel == "onnxruntime":
        missing = ort_nbits.available()
        if missing:
            return missing
    try:
        packed = pack_model(model, kind, quantized, kernel, threads, widest_only=True, codes=codes)
        weight, dense = packed.probe_pairs()[0]
        x = torch.randn(2, dense.shape[1], generator=torch.Generator().manual_seed(0))
        got = weight.matmul(x.to(weight.input_dtype)).float()
        want = x @ dense.float().t()
        error = float((got - want).norm() / want.norm())
    except Exception as exc:  # onnxruntime raises its own types; any failure means fall back
        return f"{type(exc).__name__}: {exc}"
    if not error < MAX_KERNEL_ERROR:
        return f"its product is off by {error:.1%} from the dense one on this build"
    probes[kernel] = packed
    return None

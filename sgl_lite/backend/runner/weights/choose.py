"""Chooses and installs a loaded model's weight format: the mode, the int kernel, the dtype.

Two calls at load. Before the weights are read, `read_file_codes` gives a GGUF file's own
quantized codes and `codes_only_linears` says which linears need no dense copy at all: in the
fast mode on CPU, when every decoder linear has codes onnxruntime's kernel takes, the file's
codes are the only copy (memory ≈ the file). After, `prepare_weights` resolves the settings
(formats), packs the linears for each candidate kernel, checks and times them on this CPU, and
installs the winner; every fallback is logged with its reason, and only an explicit request
that cannot run here raises.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from transformers import PretrainedConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_loader import ModelLoadError, gguf_source
from sgl_lite.backend.runner.ort_step import OrtDecodeStep, unsupported
from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.cpu import CpuCaps, cpu_caps, rows_invariant, time_kernels
from sgl_lite.backend.runner.weights.formats import (
    WeightFormat,
    resolve_dense_dtype,
    resolve_format,
)
from sgl_lite.backend.runner.weights.gguf_tensors import read_quantized
from sgl_lite.backend.runner.weights.packing import (
    HEAD,
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
# Set to 1 to keep the fast mode's decode steps on the torch path (the onnxruntime step's A/B).
DISABLE_ORT_STEP_ENV = "SGL_LITE_DISABLE_ORT_STEP"
# The most requests one onnxruntime decode step takes: its row groups where every pass runs on
# it (no dense weights to run instead).
ORT_STEP_MAX_ROWS = 16
# Beside bf16/fp16 dense weights (in oneDNN's layout), the decode batches the graph takes;
# larger ones run the torch step. One step alone (SmolLM2, ctx 128, AVX512-BF16 EPYC, 2 threads,
# quiet, `python -m bench.profile_step`; graph vs torch): 8 rows 21.7 vs 30.6 ms, 16 rows 39.7
# vs 40.8. The whole W4 16-prompt run (bench/sgl_engine.py w4, same machine, three pairs
# interleaved) decides the tie: 16 rows on torch 268 / 284 / 271 tok/s, on the graph 243 / 221
# / 226. Beside float32 dense weights (a CPU without a bf16 GEMM) the torch step's wider
# passes read 4 bytes a weight and the graph takes ORT_STEP_MAX_ROWS (`graph_beside`).
ORT_STEP_BESIDE_DENSE_MAX_ROWS = 8
# 1: keep dense float copies of a GGUF file's quantized linears beside their codes; 0: never;
# unset: where they pay (`codes_only_linears`).
DENSE_LINEARS_ENV = "SGL_LITE_DENSE_LINEARS"
# The most memory a dense copy of the linears may take to be kept for its faster prefill: a
# small model's (SmolLM2-135M: 270 MB in bf16). Above it the file's codes are the only copy,
# so memory stays near the file's size (a 1B model's dense copy is ~2 GB in bf16).
DENSE_COPY_BUDGET = 512 << 20


def read_file_codes(
    folder: Path, hf_config: PretrainedConfig, config: EngineConfig, device: torch.device
) -> dict[str, GroupAffine]:
    """The quantized codes of a GGUF model's linears by transformers name, where the int
    kernels may run them (CPU; quantization auto or int4); empty otherwise."""
    source = gguf_source(folder) if config.quantization in ("auto", "int4") else None
    if source is None or device.type != "cpu":
        return {}
    return read_quantized(source, hf_config)


class CodesPlan(NamedTuple):
    """Which linear weights are loaded as codes only (by transformers name), and why the
    others keep a dense copy (for the start-up line; "" where nothing is said)."""

    names: list[str]
    note: str


def codes_only_linears(
    model: LlamaForCausalLM, quantized: dict[str, GroupAffine], config: EngineConfig
) -> CodesPlan:
    """The decoder linears that need no dense copy: all of them when the fast mode can run
    each pass from the file's codes on onnxruntime's kernel (quantization auto, codes for every
    linear in a shape it packs) and a dense copy would take more than DENSE_COPY_BUDGET (below
    it, the copy's faster prefill is worth its memory). `DENSE_LINEARS_ENV` overrides the rule.
    The model may still be on the meta device.
    """
    if config.enable_deterministic_inference or config.quantization != "auto" or not quantized:
        return CodesPlan([], "")
    forced = os.environ.get(DENSE_LINEARS_ENV)
    if forced == "1" or ort_nbits.available():
        return CodesPlan([], "")
    kind = packed_file_kind(model, quantized)
    if kind is None or shape_problem(model, kind):
        return CodesPlan([], "")
    names = [name for name in quantized if name.startswith("model.layers.")]
    dense, _ = resolve_dense_dtype(config.dtype, "cpu", cpu_caps())
    size = sum(quantized[name].q.numel() for name in names) * dense.itemsize
    if forced == "0" or size > DENSE_COPY_BUDGET:
        return CodesPlan(names + _codes_only_embedding(model, quantized), "")
    # A rule, not a timing: a probe timed at load chose differently on a busy machine, and the
    # mode must not change from one start to the next. Measured on the embedded model: the
    # dense GEMM takes a 256-row pass of its widest linear in 2.4 ms, MatMulNBits in 4.4.
    return CodesPlan(
        [],
        f"; a dense copy of the linears kept for prefill ({size / 2**20:.0f} MB, within "
        f"{DENSE_COPY_BUDGET >> 20} MB)",
    )


def _codes_only_embedding(model: LlamaForCausalLM, quantized: dict[str, GroupAffine]) -> list[str]:
    """[the token table's name] where it can stay codes (`weights.embedding`) beside codes-only
    linears: nothing else reads the dense table once the head runs from 8-bit codes of the
    file (the tied table's own, or an untied head's), else []."""
    table = quantized.get(HEAD)
    head = table if model.tied else quantized.get("lm_head.weight")
    if table is None or head is None or head.bits != 8:
        return []
    return [HEAD]


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
    quantized: dict[str, GroupAffine],
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
    file_kind = packed_file_kind(model, quantized) if quantized else None
    kind = config.quantization if config.quantization in ("int4", "int8") else file_kind
    problem = shape_problem(model, kind) if kind and on_cpu else None
    note = f"; the file's linears: {file_formats(model, quantized)}" if file_kind else ""
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
    step, step_note = _decode_step(model, kind, quantized, threads, codes, max_rows=rows)
    if step is not None and in_groups:
        step.decode_groups = True
        step_note += f", larger ones in groups of {step.max_rows}"
    # In the format's reason, so the start-up line and /get_server_info say which step runs.
    return PreparedWeights(replace(fmt, reason=fmt.reason + step_note), note, step)


def graph_beside(dense: torch.dtype) -> tuple[int, bool]:
    """Beside dense weights of `dense` dtype: the most decode rows one onnxruntime graph run
    takes, and whether larger decode batches run on it too, in groups of that many.

    float32 (an AVX2 EPYC, no bf16 GEMM; SmolLM2, 2 threads, quiet): one step alone
    (`python -m bench.profile_step`, ctx 128; graph vs torch) 8 rows 35.2 vs 55.0 ms, 16 rows
    61.1 vs 106.4 ms, 32 rows 95.8 vs 166.5 ms; the whole W4 16-prompt run (two pairs
    interleaved in one process) 134 / 144 tok/s with 16 rows on the graph, 111 / 116 on torch;
    W1 unchanged (10.65 vs 10.79 s). So beside float32 weights larger decode batches run on
    the graph too, in groups of this many rows (`OrtDecodeStep.decode_groups`).
    """
    if dense is torch.float32:
        return ORT_STEP_MAX_ROWS, True
    return ORT_STEP_BESIDE_DENSE_MAX_ROWS, False


def _wants_codes(model: LlamaForCausalLM, fmt: WeightFormat) -> bool:
    """Whether the fast mode will read the fused linears' exact codes: torch's int4 packing
    does, and so does the onnxruntime step where it can run."""
    return fmt.int_kind == "int4" or _ort_step_blocker(model) is None


def _ort_step_blocker(model: LlamaForCausalLM) -> str | None:
    """Why the onnxruntime decode step will not be built for `model`, or None if it will be
    tried: onnxruntime missing or failing its probe, a block it cannot express, or the A/B
    switch."""
    if os.environ.get(DISABLE_ORT_STEP_ENV) == "1":
        return f"{DISABLE_ORT_STEP_ENV}=1"
    return ort_nbits.available() or unsupported(model)


def _decode_step(
    model: LlamaForCausalLM,
    kind: str,
    quantized: dict[str, GroupAffine],
    threads: int,
    codes: tuple[dict[str, GroupAffine], GroupAffine] | None = None,
    consume: bool = False,
    max_rows: int = ORT_STEP_MAX_ROWS,
) -> tuple[OrtDecodeStep | None, str]:
    """The fast mode's whole decode step on onnxruntime for passes of up to `max_rows`
    requests, or None and why not (logged); `codes` are `exact_codes`' answer where the caller
    has it, emptied by the build where `consume` (nothing else may need them then: a failed
    build raises ModelLoadError)."""
    why = _ort_step_blocker(model)
    step = None
    if not why:
        try:
            linears, head = codes or exact_codes(model, kind, quantized)
            step = OrtDecodeStep.build(model, linears, head, threads, max_rows, consume=consume)
        except Exception as exc:  # onnxruntime raises its own types; any failure falls back
            why = f"{type(exc).__name__}: {exc}"
            if consume:
                raise ModelLoadError(
                    f"the onnxruntime graph of this file's codes failed to build ({why}); "
                    f"set {DENSE_LINEARS_ENV}=1 to run the dense weights"
                ) from exc
    if step is None:
        logger.info("sgl_lite weights: decode steps on torch (onnxruntime step not used: %s)", why)
        return None, f"; decode steps on torch (onnxruntime step not used: {why})"
    return step, (
        f"; decode steps of <= {step.max_rows} requests: one onnxruntime graph "
        f"(built in {step.build_seconds:.1f}s)"
    )


def _install_codes_only(
    model: LlamaForCausalLM,
    fmt: WeightFormat,
    quantized: dict[str, GroupAffine],
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
    # Where the graph cannot express the model, `_decode_step` says so before touching `codes`
    # (they then feed the per-linear sessions below); once it starts, it owns them.
    step, step_note = _decode_step(model, kind, quantized, threads, codes, consume=True)
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


def _codes_problem(packed: PackedModel, codes: dict[str, GroupAffine]) -> str | None:
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
    quantized: dict[str, GroupAffine],
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
    quantized: dict[str, GroupAffine],
    config: EngineConfig,
    caps: CpuCaps | None,
    threads: int,
    note: str,
    key: tuple[object, ...],
    codes: tuple[dict[str, GroupAffine], GroupAffine] | None = None,
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
    quantized: dict[str, GroupAffine],
    kernel: str,
    threads: int,
    probes: dict[str, PackedModel],
    codes: dict[str, GroupAffine] | None = None,
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

"""Whether the fast mode's decode step runs as one onnxruntime graph, and on how many rows.

`build_decode_step` builds the step from the linears' codes (`ort_step.OrtDecodeStep`) or says
why not: onnxruntime missing, a block the graph cannot express, the A/B switch, or a failed
build (every reason logged and put on the start-up line). `graph_beside` gives the most decode
rows one graph run takes beside the dense weights of a given dtype, and whether larger decode
batches run on it in groups of that many.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

import torch

from sgl_lite.backend.runner.model_loader import ModelLoadError
from sgl_lite.backend.runner.ort_step import OrtDecodeStep, unsupported
from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.codes_plan import DENSE_LINEARS_ENV
from sgl_lite.backend.runner.weights.packing import exact_codes
from sgl_lite.backend.runner.weights.quant import GroupAffine

if TYPE_CHECKING:
    from sgl_lite.backend.runner.models.llama import LlamaForCausalLM

logger = logging.getLogger("sgl_lite")

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
# passes read 4 bytes a weight and the graph takes more (`graph_beside`).
ORT_STEP_BESIDE_DENSE_MAX_ROWS = 8
# Beside float32 dense weights, the rows of one graph run; larger decode batches run in groups
# of this many. Twice ORT_STEP_MAX_ROWS: where the codes are the only weights (a 1B model, every
# pass on the graph) a run's rows already keep the cores busy (Llama-1B Q4_K_M, 32 rows: 442 ms
# in one run, 430 in two of 16), but a small model's run is short enough that what each run
# pays once (streaming every weight, ~850 ops' dispatch) shows (`graph_beside`).
ORT_STEP_BESIDE_FLOAT32_MAX_ROWS = 32


def graph_beside(dense: torch.dtype) -> tuple[int, bool]:
    """Beside dense weights of `dense` dtype: the most decode rows one onnxruntime graph run
    takes, and whether larger decode batches run on it too, in groups of that many.

    float32 (an AVX2 EPYC, no bf16 GEMM; SmolLM2, 2 threads, quiet): one step alone
    (`python -m bench.profile_step`, ctx 128; graph vs torch) 8 rows 35.2 vs 55.0 ms, 16 rows
    61.1 vs 106.4 ms, 32 rows 95.8 vs 166.5 ms; the whole W4 16-prompt run (two pairs
    interleaved in one process) 134 / 144 tok/s with 16 rows on the graph, 111 / 116 on torch;
    W1 unchanged (10.65 vs 10.79 s). So beside float32 weights larger decode batches run on
    the graph too, in groups (`OrtDecodeStep.decode_groups`) of up to
    ORT_STEP_BESIDE_FLOAT32_MAX_ROWS: one run of 32 rows beats two of 16 (an AVX-512 Xeon
    without AMX, same bench, one process; one run / groups of 16 / torch): 24 rows 82.8 /
    93.9 / 108.5 ms, 32 rows 94.7 / 117.1 / 108.1, 64 rows (one run of 64) 198.5 / 279.7 /
    215.4; and so does one request's chunk of 24 new tokens after 128 (77-80 ms on the graph,
    117-119 on the float32 GEMM; 32 tokens 91-94 vs 92-110).
    """
    if dense is torch.float32:
        return ORT_STEP_BESIDE_FLOAT32_MAX_ROWS, True
    return ORT_STEP_BESIDE_DENSE_MAX_ROWS, False


def ort_step_blocker(model: LlamaForCausalLM) -> str | None:
    """Why the onnxruntime decode step will not be built for `model`, or None if it will be
    tried: onnxruntime missing or failing its probe, a block it cannot express, or the A/B
    switch."""
    if os.environ.get(DISABLE_ORT_STEP_ENV) == "1":
        return f"{DISABLE_ORT_STEP_ENV}=1"
    return ort_nbits.available() or unsupported(model)


def build_decode_step(
    model: LlamaForCausalLM,
    kind: str,
    quantized: MutableMapping[str, GroupAffine],
    threads: int,
    codes: tuple[MutableMapping[str, GroupAffine], GroupAffine] | None = None,
    consume: bool = False,
    max_rows: int = ORT_STEP_MAX_ROWS,
) -> tuple[OrtDecodeStep | None, str]:
    """The fast mode's whole decode step on onnxruntime for passes of up to `max_rows`
    requests, or None and why not (logged); `codes` are `exact_codes`' answer where the caller
    has it, emptied by the build where `consume` (nothing else may need them then: a failed
    build raises ModelLoadError)."""
    why = ort_step_blocker(model)
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

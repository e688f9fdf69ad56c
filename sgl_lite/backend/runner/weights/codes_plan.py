"""Which of a GGUF model's linears load as the file's codes alone, with no dense copy.

Before the weights are read, `read_file_codes` gives the file's own quantized codes of each
linear (decoded as they are read) and `codes_only_linears` decides, from their formats alone,
where a dense copy is not kept: in the fast mode on CPU,
when every decoder linear has codes onnxruntime's kernel takes and a dense copy would be larger
than DENSE_COPY_BUDGET, the file's codes are the only copy (memory ≈ the file) and every pass
runs on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from transformers import PretrainedConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_loader import gguf_source
from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.cpu import cpu_caps
from sgl_lite.backend.runner.weights.formats import resolve_dense_dtype
from sgl_lite.backend.runner.weights.gguf_tensors import FileCodes
from sgl_lite.backend.runner.weights.packing import HEAD, shape_problem
from sgl_lite.backend.runner.weights.packing import file_kind as packed_file_kind
from sgl_lite.backend.runner.weights.quant import GroupAffine

if TYPE_CHECKING:
    from sgl_lite.backend.runner.models.llama import LlamaForCausalLM

# 1: keep dense float copies of a GGUF file's quantized linears beside their codes; 0: never;
# unset: where they pay (`codes_only_linears`).
DENSE_LINEARS_ENV = "SGL_LITE_DENSE_LINEARS"
# The most memory a dense copy of the linears may take to be kept for its faster prefill: a
# small model's (SmolLM2-135M: 270 MB in bf16). Above it the file's codes are the only copy,
# so memory stays near the file's size (a 1B model's dense copy is ~2 GB in bf16).
DENSE_COPY_BUDGET = 512 << 20


def read_file_codes(
    folder: Path, hf_config: PretrainedConfig, config: EngineConfig, device: torch.device
) -> FileCodes | None:
    """The quantized codes of a GGUF model's linears by transformers name, read from the file
    as they are used, where the int kernels may run them (CPU; quantization auto or int4);
    None otherwise."""
    source = gguf_source(folder) if config.quantization in ("auto", "int4") else None
    if source is None or device.type != "cpu":
        return None
    return FileCodes(source, hf_config)


def code_formats(codes: Mapping[str, GroupAffine]) -> Mapping[str, GroupAffine]:
    """`codes` as shapes, widths and groups, for the plans that read no more: the file's
    `FileCodes.formats` (nothing decoded), or codes already decoded as they are."""
    return codes.formats() if isinstance(codes, FileCodes) else codes


class CodesPlan(NamedTuple):
    """Which linear weights are loaded as codes only (by transformers name), and why the
    others keep a dense copy (for the start-up line; "" where nothing is said)."""

    names: list[str]
    note: str


def codes_only_linears(
    model: LlamaForCausalLM, quantized: Mapping[str, GroupAffine], config: EngineConfig
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
    dense, _ = resolve_dense_dtype(config.dtype, "cpu", cpu_caps(), prefill_only=True)
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


def _codes_only_embedding(
    model: LlamaForCausalLM, quantized: Mapping[str, GroupAffine]
) -> list[str]:
    """[the token table's name] where it can stay codes (`weights.embedding`) beside codes-only
    linears: nothing else reads the dense table once the head runs from 8-bit codes of the
    file (the tied table's own, or an untied head's), else []."""
    table = quantized.get(HEAD)
    head = table if model.tied else quantized.get("lm_head.weight")
    if table is None or head is None or head.bits != 8:
        return []
    return [HEAD]

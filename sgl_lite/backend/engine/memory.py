"""The KV pool's size for one model at start-up: SGLang's `--mem-fraction-static` resolved.

The pure arithmetic (free memory, weight bytes, tokens that fit, caps) is `kvcache.sizing`;
this module adds what only start-up knows: the model's shapes, its context length and the dtype
the runner will load. On CPU the pool is capped at max_running_requests x context length (see
`kvcache.sizing`); on CUDA, as in SGLang, only `max_total_tokens` caps it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from sgl_lite.backend.config import DTYPES, EngineConfig
from sgl_lite.backend.kvcache.sizing import (
    available_memory,
    capped_pool,
    pool_tokens,
    safetensors_weight_bytes,
    slot_bytes,
    usable_tokens,
)
from sgl_lite.backend.runner.model_loader import gguf_source, load_config, resolve_model_path
from sgl_lite.backend.runner.model_runner import context_length_of
from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.weights.codes_plan import DENSE_COPY_BUDGET
from sgl_lite.backend.runner.weights.cpu import cpu_caps
from sgl_lite.backend.runner.weights.formats import resolve_dense_dtype
from sgl_lite.backend.runner.weights.gguf_tensors import FLOAT_TYPE_IDS, read_header

logger = logging.getLogger("sgl_lite")


def weight_bytes(folder: Path, dtype: str) -> int:
    """Bytes the model's weights take dense in `dtype` (an upper bound where a GGUF file's
    linears run from their codes): from the file's tensor shapes for a GGUF model, whose folder
    holds no weights, else from the safetensors headers."""
    source = gguf_source(folder)
    if source is None:
        return safetensors_weight_bytes(folder, dtype)
    elements = sum(math.prod(tensor.dims) for tensor in read_header(source).tensors)
    return elements * DTYPES[dtype].itemsize


def kv_bytes_per_token(folder: Path, dtype: str) -> int:
    """K and V bytes one token takes across all layers."""
    config = load_config(folder)
    heads = config.num_key_value_heads
    return 2 * config.num_hidden_layers * heads * head_dim_of(config) * DTYPES[dtype].itemsize


def dense_dtype_name(config: EngineConfig) -> str:
    """The dense dtype the runner will load (`auto` resolved as `weights.formats` does)."""
    if config.dtype != "auto":
        return config.dtype
    caps = None if config.device.startswith("cuda") else cpu_caps()
    prefill_only = caps is not None and _decodes_on_int_kernels(config)
    chosen, _ = resolve_dense_dtype("auto", config.device, caps, prefill_only)
    return next(name for name, dt in DTYPES.items() if dt == chosen)


def _decodes_on_int_kernels(config: EngineConfig) -> bool:
    """Whether the fast mode will decode this model on int kernels beside a dense copy for the
    long passes (`formats.resolve_dense_dtype`'s `prefill_only`): an int quantization asked for,
    or (`auto`) a GGUF file holding block codes whose layers' dense float32 copy fits
    `codes_plan.DENSE_COPY_BUDGET` (above it every pass runs the codes). An estimate for files
    whose codes have no int form (IQ formats alone run dense)."""
    if config.enable_deterministic_inference or config.quantization == "none":
        return False
    if config.quantization in ("int4", "int8"):
        return True
    source = gguf_source(resolve_model_path(config.model_path))
    if source is None:
        return False
    tensors = read_header(source).tensors
    layers = sum(
        math.prod(t.dims) for t in tensors if t.name.startswith("blk.") and len(t.dims) > 1
    )
    coded = any(tensor.type_id not in FLOAT_TYPE_IDS for tensor in tensors)
    return coded and layers * 4 <= DENSE_COPY_BUDGET


def resolve_mem_fraction(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Engine keyword arguments with `mem_fraction_static` turned into `max_total_tokens`.

    The pool size is resolved before the config is built (SGLang's rule: a `max_total_tokens`
    given too caps it; on CPU so does max_running_requests x context length); without
    `mem_fraction_static` the arguments come back unchanged. Logs the size and what set it.
    """
    fraction = kwargs.get("mem_fraction_static")
    if fraction is None:
        return {k: v for k, v in kwargs.items() if k != "mem_fraction_static"}
    rest = {k: v for k, v in kwargs.items() if k not in ("mem_fraction_static", "max_total_tokens")}
    config = EngineConfig.from_kwargs(**rest)  # dtype and device as the engine will use them
    folder = resolve_model_path(config.model_path)
    dtype = dense_dtype_name(config)
    free, weights = available_memory(config.device), weight_bytes(folder, dtype)
    per_token = slot_bytes(kv_bytes_per_token(folder, dtype))  # K/V + logprob entries
    fits = pool_tokens(float(fraction), free, weights, per_token)
    on_cpu = not config.device.startswith("cuda")
    caps: list[tuple[str, int | None]] = []
    if on_cpu:  # shared RAM: the pool takes no more than the model can use
        running = config.max_running_requests
        context = context_length_of(load_config(folder), config.context_length)
        usable = usable_tokens(running, context)
        caps.append((f"max_running_requests {running} x context {context}", usable))
    caps.append(("max_total_tokens", kwargs.get("max_total_tokens")))
    size = capped_pool(fits, caps)
    logger.info(
        "mem_fraction_static=%s: KV pool of %d tokens%s, %.1f MB%s; %s of %.2f GiB free %s less "
        "%.2f GiB of weights",
        fraction,
        size.tokens,
        f" (capped by {size.capped_by} from {fits})" if size.capped_by else "",
        size.tokens * per_token / 2**20,
        " committed as it is used" if on_cpu else "",
        fraction,
        free / 2**30,
        "RAM" if on_cpu else f"on {config.device}",
        weights / 2**30,
    )
    return {**rest, "max_total_tokens": size.tokens}

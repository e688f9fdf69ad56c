"""The KV pool's size for one model at start-up: SGLang's `--mem-fraction-static` resolved.

The pure arithmetic (free memory, weight bytes, tokens that fit) is `kvcache.sizing`; this
module adds what only start-up knows: the model's shapes and the dtype the runner will load.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sgl_lite.backend.config import DTYPES, EngineConfig
from sgl_lite.backend.kvcache.sizing import available_memory, pool_tokens, weight_bytes
from sgl_lite.backend.runner.model_loader import load_config, resolve_model_path
from sgl_lite.backend.runner.models.llama import head_dim_of
from sgl_lite.backend.runner.weights.cpu import cpu_caps
from sgl_lite.backend.runner.weights.formats import resolve_dense_dtype

logger = logging.getLogger("sgl_lite")


def kv_bytes_per_token(folder: Path, dtype: str) -> int:
    """K and V bytes one token takes across all layers."""
    config = load_config(folder)
    heads = config.num_key_value_heads
    return 2 * config.num_hidden_layers * heads * head_dim_of(config) * DTYPES[dtype].itemsize


def pool_tokens_for(folder: Path, fraction: float, dtype: str, device: str) -> int:
    """`pool_tokens` for the model in `folder` loaded in `dtype` on `device`, measured now."""
    return pool_tokens(
        fraction,
        available_memory(device),
        weight_bytes(folder, dtype),
        kv_bytes_per_token(folder, dtype),
    )


def dense_dtype_name(config: EngineConfig) -> str:
    """The dense dtype the runner will load (`auto` resolved as `weights.formats` does)."""
    if config.dtype != "auto":
        return config.dtype
    caps = None if config.device.startswith("cuda") else cpu_caps()
    chosen, _ = resolve_dense_dtype("auto", config.device, caps)
    return next(name for name, dt in DTYPES.items() if dt == chosen)


def resolve_mem_fraction(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Engine keyword arguments with `mem_fraction_static` turned into `max_total_tokens`.

    The pool size is resolved before the config is built (SGLang's rule: a `max_total_tokens`
    given too caps it); without `mem_fraction_static` the arguments come back unchanged.
    """
    fraction = kwargs.get("mem_fraction_static")
    if fraction is None:
        return {k: v for k, v in kwargs.items() if k != "mem_fraction_static"}
    rest = {k: v for k, v in kwargs.items() if k not in ("mem_fraction_static", "max_total_tokens")}
    config = EngineConfig.from_kwargs(**rest)  # dtype and device as the engine will use them
    folder = resolve_model_path(config.model_path)
    tokens = pool_tokens_for(folder, float(fraction), dense_dtype_name(config), config.device)
    cap = kwargs.get("max_total_tokens")
    logger.info(
        "mem_fraction_static=%s: KV pool of %d tokens%s",
        fraction,
        min(tokens, cap) if cap is not None else tokens,
        f" (capped by max_total_tokens from {tokens})" if cap is not None and cap < tokens else "",
    )
    return {**rest, "max_total_tokens": min(tokens, cap) if cap is not None else tokens}

"""KV pool sizing from free memory, as SGLang's `--mem-fraction-static` does it.

SGLang gives weights plus KV pool a fixed fraction of the accelerator's memory; the pool gets
what the weights leave. Here the same rule covers both devices, measured before the weights
load:

    pool bytes = free memory x fraction - weight bytes
    pool tokens = pool bytes // (2 x layers x kv_heads x head_dim x dtype size)

Free memory is `torch.cuda.mem_get_info` on CUDA and, on CPU, the kernel's `MemAvailable`
(/proc/meminfo; `os.sysconf` where there is no /proc), lowered to what a cgroup limit leaves.
Nothing is allocated here: the functions only read sizes (weights from safetensors headers).
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

from sgl_lite.backend.config import DTYPES, EngineConfig
from sgl_lite.backend.model_loader import load_config, resolve_model_path
from sgl_lite.backend.models.llama import head_dim_of

logger = logging.getLogger("sgl_lite")

MIN_POOL_TOKENS = 16  # EngineConfig's lower bound for max_total_tokens


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_headroom(root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes a cgroup v2 memory limit still leaves this process's group (None: no limit)."""
    try:
        limit = Path(root, "memory.max").read_text().strip()
        used = int(Path(root, "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def available_cpu_memory() -> int:
    """Bytes of RAM this process could still take: MemAvailable, capped by a cgroup limit."""
    free = _meminfo_available()
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    headroom = _cgroup_headroom()
    return free if headroom is None else min(free, headroom)


def available_memory(device: str) -> int:
    """Free bytes on `device` ("cpu" or a CUDA device) right now."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return available_cpu_memory()


def weight_bytes(folder: Path, dtype: str) -> int:
    """Bytes the model's weights take once loaded in `dtype`, read from the safetensors headers
    (8-byte little-endian header length, then a JSON header with each tensor's shape)."""
    itemsize = DTYPES[dtype].itemsize
    total = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total * itemsize


def kv_bytes_per_token(folder: Path, dtype: str) -> int:
    """K and V bytes one token takes across all layers."""
    config = load_config(folder)
    heads = config.num_key_value_heads
    return 2 * config.num_hidden_layers * heads * head_dim_of(config) * DTYPES[dtype].itemsize


def pool_tokens(fraction: float, available: int, weights: int, per_token: int) -> int:
    """KV pool tokens for `fraction` of `available` bytes once `weights` bytes are loaded.

    ValueError when the fraction leaves no room for a pool, naming the numbers.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {fraction}")
    budget = int(available * fraction) - weights
    tokens = budget // per_token if budget > 0 else 0
    if tokens < MIN_POOL_TOKENS:
        gib = 2**30
        raise ValueError(
            f"mem_fraction_static={fraction} of {available / gib:.2f} GiB free memory leaves "
            f"{max(budget, 0) / gib:.2f} GiB after {weights / gib:.2f} GiB of weights: room for "
            f"{tokens} KV tokens (at least {MIN_POOL_TOKENS} needed); raise the fraction or "
            "free memory"
        )
    return tokens


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
    from sgl_lite.backend.weights.cpu import cpu_caps
    from sgl_lite.backend.weights.formats import resolve_dense_dtype

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

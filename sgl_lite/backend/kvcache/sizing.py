"""KV pool sizing from free memory, as SGLang's `--mem-fraction-static` does it (the arithmetic;
`engine/memory.py` applies it to one model at start-up).

SGLang gives weights plus KV pool a fixed fraction of the accelerator's memory; the pool gets
what the weights leave. Here the same rule covers both devices, measured before the weights
load:

    pool bytes = free memory x fraction - weight bytes
    pool tokens = pool bytes // (2 x layers x kv_heads x head_dim x dtype size + side bytes)

where the side bytes are each slot's prompt logprob and its top entries (`slot_bytes`;
logprob_store.py), a few dozen bytes beside kilobytes of K/V.

Free memory is `torch.cuda.mem_get_info` on CUDA and, on CPU, the kernel's `MemAvailable`
(/proc/meminfo; `os.sysconf` where there is no /proc), lowered to what a cgroup limit leaves.
Nothing is allocated here: the functions only read sizes (weights from safetensors headers).

On a GPU the fraction is of memory the server owns. On a CPU box the RAM is shared, so there
the fraction is a ceiling: the pool's pages are committed as slots are first used (kv_pool),
and the pool is also capped at what the model can use, max_running_requests x context length
tokens (`capped_pool`). SGLang does not cap by context on CUDA, and neither do we.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from sgl_lite.backend.config import DTYPES
from sgl_lite.backend.kvcache.logprob_store import BYTES_PER_SLOT

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


def safetensors_weight_bytes(folder: Path, dtype: str) -> int:
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


def slot_bytes(kv_bytes_per_token: int) -> int:
    """Bytes one pool slot takes: its K/V plus the prompt logprob entries kept beside it."""
    return kv_bytes_per_token + BYTES_PER_SLOT


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


class PoolSize(NamedTuple):
    """A KV pool's size in tokens, what the fraction had room for, and what capped it."""

    tokens: int
    fits: int  # tokens the memory fraction leaves room for
    capped_by: str | None  # the name of the cap that set `tokens`; None: the fraction did


def usable_tokens(max_running_requests: int, context_length: int) -> int:
    """The most KV tokens the model can hold at once: every running request at full context."""
    return max(max_running_requests * context_length, MIN_POOL_TOKENS)


def capped_pool(fits: int, caps: Sequence[tuple[str, int | None]]) -> PoolSize:
    """`fits` tokens lowered to the smallest of the named `caps` (None: that cap is not set)."""
    size = PoolSize(fits, fits, None)
    for name, cap in caps:
        if cap is not None and cap < size.tokens:
            size = PoolSize(cap, fits, name)
    return size

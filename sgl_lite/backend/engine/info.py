"""engine_info: the snapshot of an engine's config, pool, cache and queues (`get_server_info`).

Runs on the engine's loop thread (the engine calls it there), so the numbers are consistent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sgl_lite.backend import omp_policy


def engine_info(engine: Any) -> dict[str, Any]:
    """Config, pool usage, cache statistics and queue lengths of `engine`."""
    cache, pool, scheduler = engine.cache, engine.runner.pool, engine.scheduler
    return {
        **dataclasses.asdict(engine.config),
        "model_path": str(engine.model_folder),
        "context_length": engine.context_length,
        "num_threads": torch.get_num_threads(),
        # The KV pool's capacity in tokens under SGLang's key. NOTE: `max_total_tokens` is
        # sgl_lite's earlier key for it, kept as an alias for one release (the same number: the
        # pool's, which a runner built outside the config may size differently from the config).
        "max_total_num_tokens": pool.num_slots,
        "max_total_tokens": pool.num_slots,
        "kv_pool_bytes": pool.nbytes,
        "pool_free_tokens": pool.num_free,
        "pool_used_tokens": pool.num_slots - pool.num_free,
        "cached_tokens": cache.tree.cached_tokens,
        "evictable_tokens": cache.tree.evictable_tokens,
        "evicted_tokens": cache.tree.evictions,
        "cache_hit_tokens": scheduler.cache_hit_tokens,
        "prompt_tokens_submitted": scheduler.prompt_tokens_admitted,
        "cache_hit_rate": scheduler.cache_hit_tokens / max(scheduler.prompt_tokens_admitted, 1),
        "num_running_reqs": len(scheduler.running),
        "num_waiting_reqs": len(scheduler.waiting),
        "num_queued_reqs": engine.admission.num_queued,
        "rejected_requests": engine.admission.rejected,
        "max_running_batch_seen": scheduler.max_running_seen,
        "preemptions": scheduler.preemptions,
        "forward_passes": engine.forward_passes,
        "grammar_compiles": engine.builder.compile_stats,
        # the mode, kernels and dtypes the runner chose, as its start-up line says them
        "weight_format": fmt.describe()
        if (fmt := getattr(engine.runner, "format", None))
        else None,
        "openmp_wait_policy": omp_policy.note(),
    }

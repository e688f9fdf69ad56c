"""Scheduler and cache manager without a model: batches, chunking, eviction, preemption, slots."""

from __future__ import annotations

import random

import pytest

from sgl_lite.backend.cache_manager import CacheManager
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.kv_pool import KVPool
from sgl_lite.backend.request import Req
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler import Scheduler


def make(pool_size: int, **config) -> tuple[Scheduler, CacheManager]:
    pool = KVPool(num_layers=1, num_slots=pool_size, num_kv_heads=1, head_dim=2)
    cfg = EngineConfig(max_total_tokens=pool_size, device="cpu", **config)
    cache = CacheManager(pool, cfg.disable_radix_cache)
    return Scheduler(cfg, cache), cache


def req(ids: list[int], new_tokens: int) -> Req:
    return Req(
        rid=str(random.random()),
        input_ids=ids,
        sampling_params=SamplingParams(max_new_tokens=new_tokens),
    )


def run_to_completion(scheduler: Scheduler, cache: CacheManager, max_steps: int = 10_000):
    """Fake model: every completed sequence 'samples' token 7; requests stop at max_new_tokens."""
    steps = []
    for _ in range(max_steps):
        batch = scheduler.schedule()
        if batch is None:
            break
        steps.append([len(s.token_ids) for s in batch.segments])
        for i, r in enumerate(batch.reqs):
            if batch.completes(i):
                r.output_ids.append(7)
                if len(r.output_ids) >= r.sampling_params.max_new_tokens:
                    r.finish_reason = {"type": "length"}
        for r in batch.reqs:
            if r.finish_reason is not None:
                scheduler.finish(r)
        scheduler.after_step(batch)
        cache.check_integrity(scheduler.running)
    assert not scheduler.has_work, "requests left unfinished"
    return steps


def test_prefill_is_chunked_under_the_token_budget():
    scheduler, cache = make(1000, chunked_prefill_size=64)
    scheduler.add(req(list(range(200)), 3))
    steps = run_to_completion(scheduler, cache)
    assert steps[:4] == [[64], [64], [64], [8]]
    assert cache.tree.cached_tokens == 202  # prompt + the outputs that have K/V


def test_shared_prefix_in_one_batch_is_computed_once():
    scheduler, cache = make(2000)
    system = list(range(100, 400))
    for i in range(4):
        scheduler.add(req(system + [i, i + 1], 2))
    steps = run_to_completion(scheduler, cache)
    assert steps[0] == [302]  # the others waited one step for the shared prefix ...
    # ... then computed only their own suffix, while the first one decodes in the same pass.
    assert steps[1] == [2, 2, 2, 1]
    assert cache.hit_tokens == 3 * 300


def test_tiny_pool_evicts_then_preempts_and_everything_finishes():
    scheduler, cache = make(120)
    rng = random.Random(0)
    reqs = [req([rng.randrange(1000) for _ in range(30)], 20) for _ in range(6)]
    for r in reqs:
        scheduler.add(r)
    run_to_completion(scheduler, cache)
    assert all(len(r.output_ids) == 20 for r in reqs)
    assert scheduler.preemptions > 0
    assert cache.flush()
    assert cache.pool.num_free == 120


def test_disabled_cache_keeps_the_tree_empty_and_frees_everything():
    scheduler, cache = make(500, disable_radix_cache=True)
    for i in range(3):
        scheduler.add(req([1, 2, 3, 4, 5, i], 4))
    run_to_completion(scheduler, cache)
    assert cache.tree.cached_tokens == 0 and cache.pool.num_free == 500


def test_abort_of_a_running_request_frees_its_slots():
    scheduler, cache = make(500)
    r = req(list(range(50)), 10)
    scheduler.add(r)
    scheduler.schedule()
    assert r in scheduler.running
    scheduler.remove(r)
    cache.check_integrity(scheduler.running)
    assert cache.pool.num_free == 500


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_policies_admit_in_their_order(policy):
    scheduler, cache = make(1000, schedule_policy=policy, max_running_requests=1)
    warm = req([9] * 40, 1)
    scheduler.add(warm)
    run_to_completion(scheduler, cache)
    cold, hot = req([1] * 40, 1), req([9] * 40 + [1], 1)
    scheduler.add(cold)
    scheduler.add(hot)
    batch = scheduler.schedule()
    assert batch.reqs == ([hot] if policy == "lpm" else [cold])

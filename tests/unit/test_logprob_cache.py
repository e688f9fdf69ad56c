"""Prompt logprobs kept beside the K/V and served from the radix cache: the per-slot store, and
the real Engine on a fake runner (logits a function of the sequence read back through the
slots) answering echo requests cache-on exactly as cache-off, with less computed."""

from __future__ import annotations

import random

import pytest
import torch

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.kvcache.logprob_store import BYTES_PER_SLOT, TOP_K
from sgl_lite.backend.kvcache.sizing import slot_bytes
from tests.support.fakes import ByteTokenizer, FakeRunner

ECHO = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
ONE = {"temperature": 0, "max_new_tokens": 1}


def make(disable: bool = False, pool_size: int = 4096, **config) -> Engine:
    return Engine(
        runner=FakeRunner(num_slots=pool_size),
        tokenizer=ByteTokenizer(),
        device="cpu",
        max_total_tokens=pool_size,
        disable_radix_cache=disable,
        **config,
    )


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def run(engine: Engine, prompts: list[list[int]], **kw) -> list[dict]:
    """Each prompt alone, in order; the meta_info of each."""
    params = {**ECHO, **kw}
    sampling = params.pop("sampling_params", ONE)
    return [
        engine.generate(input_ids=p, sampling_params=sampling, **params)["meta_info"]
        for p in prompts
    ]


def computed(engine: Engine) -> int:
    """Prompt tokens the engine computed (submitted less those taken from the cache)."""
    info = engine.get_server_info()
    return info["prompt_tokens_submitted"] - info["cache_hit_tokens"]


def same_logprobs(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b, strict=True):
        for key in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs"):
            assert x.get(key) == y.get(key), key


MC_CONTEXT = ids(120, 1)
MC_PROMPTS = [MC_CONTEXT + ids(5 + i, 10 + i) for i in range(4)]


@pytest.fixture(scope="module")
def uncached() -> list[dict]:
    with make(disable=True) as engine:
        metas = run(engine, MC_PROMPTS)
        assert computed(engine) == sum(map(len, MC_PROMPTS))
    return metas


# --- the store --------------------------------------------------------------------------


def test_store_keeps_entries_by_slot_and_forgets_them_when_the_slot_is_freed() -> None:
    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=2)
    store = pool.logprobs
    slots = pool.alloc(4)
    assert slots is not None and store.known_prefix(slots) == 0
    top = [[(-0.5 - j - i, 10 * i + j) for j in range(TOP_K)] for i in range(3)]
    store.write(slots[:3], [-1.0, -2.0, -3.0], top)
    assert store.known_prefix(slots) == 3 and store.known_prefix(slots[1:]) == 2
    got = store.read(slots[1:3])
    assert got.chosen == [-2.0, -3.0] and got.top == top[1:3]
    pool.free(slots[1:2])  # freed: evicted with its node, unknown to its next owner
    assert store.known_prefix(slots) == 1
    assert pool.nbytes + pool.side_nbytes == 8 * slot_bytes(2 * 1 * 1 * 2 * 4)
    assert BYTES_PER_SLOT < 64  # a few bytes beside each token, whatever the model


def test_store_refuses_fewer_top_entries_than_it_keeps() -> None:
    pool = KVPool(num_layers=1, num_slots=4, num_kv_heads=1, head_dim=2)
    with pytest.raises(ValueError, match=f">= {TOP_K} top entries"):
        pool.logprobs.write(torch.tensor([0]), [-1.0], [[(-1.0, 3)]])
    with pytest.raises(ValueError, match="expected 2 values"):
        pool.logprobs.write(torch.tensor([0, 1]), [-1.0], [[(-1.0, 3)] * TOP_K])


def test_copy_known_fills_only_the_unknown_destinations() -> None:
    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=2)
    store = pool.logprobs
    top = [[(-1.0, 1)] * TOP_K, [(-2.0, 2)] * TOP_K]
    store.write(torch.tensor([0, 1]), [-1.0, -2.0], top)
    store.write(torch.tensor([5]), [-9.0], [[(-9.0, 9)] * TOP_K])
    store.copy_known(torch.tensor([0, 1, 2]), torch.tensor([4, 5, 6]))
    assert store.read(torch.tensor([4, 5])).chosen == [-1.0, -9.0]  # 5 kept its own
    assert store.known_prefix(torch.tensor([6])) == 0  # 2 was unknown: nothing to copy


# --- the engine -------------------------------------------------------------------------


def test_echo_requests_sharing_a_context_are_served_from_the_cache_exactly(uncached) -> None:
    with make() as engine:
        metas = run(engine, MC_PROMPTS)
        engine.check_integrity()
        # the first computes everything; the others take the context's logprobs from the tree
        assert metas[0]["cached_tokens"] == 0
        assert all(m["cached_tokens"] >= len(MC_CONTEXT) - 1 for m in metas[1:])
        assert computed(engine) <= len(MC_PROMPTS[0]) + sum(len(p) - 119 for p in MC_PROMPTS)
    same_logprobs(metas, uncached)
    assert metas[1]["input_token_logprobs"][0][0] is None  # the first entry, as always


def test_a_cached_prefix_without_logprobs_is_recomputed_then_reused(uncached) -> None:
    with make() as engine:
        engine.generate(input_ids=MC_CONTEXT, sampling_params=ONE)  # K/V cached, no logprobs
        first = run(engine, MC_PROMPTS[:1])
        assert first[0]["cached_tokens"] == 0  # every entry unknown: nothing reused
        rest = run(engine, MC_PROMPTS[1:])
        assert all(m["cached_tokens"] >= len(MC_CONTEXT) - 1 for m in rest)
        engine.check_integrity()
    same_logprobs(first + rest, uncached)


def test_reuse_stops_before_the_first_unknown_entry() -> None:
    head, middle, tail = ids(40, 2), ids(20, 3), ids(10, 4)
    with make() as engine:
        run(engine, [head])  # entries for positions 1..39
        engine.generate(input_ids=head + middle, sampling_params=ONE)  # middle: K/V only
        got = run(engine, [head + middle + tail])
        # positions 1..39 are served; position 40 is unknown, so token 39 is computed again
        assert got[0]["cached_tokens"] == 39
        again = run(engine, [head + middle + tail])
        assert again[0]["cached_tokens"] == len(head + middle + tail) - 1
        engine.check_integrity()
    with make(disable=True) as reference:
        want = run(reference, [head + middle + tail])
    same_logprobs(got, want)
    same_logprobs(again, want)


@pytest.mark.parametrize(
    "params",
    [
        {"logprob_start_len": 30, "top_logprobs_num": 1},
        {"logprob_start_len": 0, "top_logprobs_num": 0},
        {"logprob_start_len": 0, "top_logprobs_num": TOP_K + 1},  # more than kept: recomputed
        {"logprob_start_len": 0, "sampling_params": {"temperature": 0, "max_new_tokens": 3}},
    ],
    ids=["start-30", "no-top", "top-over-kept", "decode-after"],
)
def test_echo_variants_match_the_uncached_engine(params) -> None:
    prompts = MC_PROMPTS + [MC_PROMPTS[0]]
    with make() as engine:
        got = run(engine, prompts, **params)
        engine.check_integrity()
    with make(disable=True) as reference:
        want = run(reference, prompts, **params)
    same_logprobs(got, want)
    if params.get("top_logprobs_num") == TOP_K + 1:
        assert all(m["cached_tokens"] == 0 for m in got)
    else:
        assert got[-1]["cached_tokens"] >= len(MC_PROMPTS[0]) - 2


def test_entries_across_a_chunked_prefill_are_all_stored() -> None:
    prompt = ids(70, 5)
    with make(chunked_prefill_size=16) as engine:
        first = run(engine, [prompt])
        again = run(engine, [prompt + [65]])
        assert again[0]["cached_tokens"] == len(prompt) - 1  # no hole at a chunk boundary
        engine.check_integrity()
    with make(disable=True) as reference:
        want = run(reference, [prompt, prompt + [65]])
    same_logprobs(first + again, want)


def test_a_tiny_pool_evicts_entries_with_their_slots_and_leaks_nothing() -> None:
    # 96 slots: each context of 60 evicts the last, and reused slots must not bring back
    # another prompt's entries
    contexts = [ids(60, 20 + i) for i in range(4)]
    prompts = [c + ids(4, 40 + j) for c in contexts for j in range(2)] + [contexts[0] + [1, 2]]
    with make(pool_size=96, max_running_requests=1) as engine:
        got = run(engine, prompts)
        engine.check_integrity()
        assert engine.get_server_info()["evicted_tokens"] > 0
        assert engine.flush_cache()
        pool = engine.runner.pool
        assert pool.num_free == pool.num_slots
        assert int(pool.logprobs.known.sum()) == 0  # freed slots keep no entry
    with make(disable=True) as reference:
        want = run(reference, prompts)
    same_logprobs(got, want)
    assert got[1]["cached_tokens"] >= 59 and got[-1]["cached_tokens"] == 0  # evicted by then


def test_concurrent_echo_requests_keep_their_entries_in_the_tree() -> None:
    # submitted together: both compute the context; the duplicate's entries land in the tree
    prompts = [MC_CONTEXT + [7, 8], MC_CONTEXT + [9, 10]]
    with make() as engine:
        together = engine.generate(input_ids=prompts, sampling_params=ONE, **ECHO)
        later = run(engine, [MC_CONTEXT + [11]])
        assert later[0]["cached_tokens"] >= len(MC_CONTEXT) - 1
        engine.check_integrity()
    with make(disable=True) as reference:
        want = run(reference, [*prompts, MC_CONTEXT + [11]])
    same_logprobs([o["meta_info"] for o in together] + later, want)

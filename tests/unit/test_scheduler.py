"""The real Engine on a fake runner and a byte tokenizer: batching, chunking, the prefix cache,
eviction, preemption, aborts and slot accounting, in milliseconds and without model files."""

from __future__ import annotations

import random

import pytest
import torch

from sgl_lite.backend.engine import Engine, GenerateInput
from sgl_lite.backend.errors import InvalidRequest
from tests.support.fakes import ByteTokenizer, FakeRunner

GREEDY = {"temperature": 0, "max_new_tokens": 6}


def make(pool_size: int = 4096, **config) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner(num_slots=pool_size)
    engine = Engine(
        runner=runner, tokenizer=ByteTokenizer(), device="cpu", max_total_tokens=pool_size, **config
    )
    return engine, runner


@pytest.fixture
def engine():
    eng, _ = make()
    yield eng
    eng.shutdown()


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def test_prefill_is_chunked_under_the_token_budget():
    engine, runner = make(chunked_prefill_size=64)
    with engine:
        out = engine.generate(input_ids=list(range(200)), sampling_params=GREEDY)
        assert runner.batches[:5] == [[64], [64], [64], [8], [1]]
        assert len(out["output_ids"]) == 6
        # the prompt and the outputs that have K/V are cached
        assert engine.get_server_info()["cached_tokens"] == 205
        engine.check_integrity()


def test_shared_prefix_in_one_batch_is_computed_once():
    engine, runner = make()
    system = ids(300, 0)
    with engine:
        outs = engine.generate(
            input_ids=[system + [i, i + 1] for i in range(4)], sampling_params=GREEDY
        )
        assert runner.batches[0] == [302]  # the others waited one step for the shared prefix ...
        # ... then computed only their own suffix, while the first one decodes in the same pass.
        assert runner.batches[1] == [2, 2, 2, 1]
        assert engine.get_server_info()["cache_hit_tokens"] == 3 * 300
        alone = [
            engine.generate(input_ids=system + [i, i + 1], sampling_params=GREEDY) for i in range(4)
        ]
        assert [o["output_ids"] for o in outs] == [a["output_ids"] for a in alone]


def test_greedy_output_is_the_same_with_the_cache_on_and_off_alone_and_batched():
    prompts = [ids(40, 1) + ids(i + 3, 100 + i) for i in range(6)]
    cached, _ = make()
    uncached, _ = make(disable_radix_cache=True)
    with cached, uncached:
        cached.generate(input_ids=prompts[:2], sampling_params=GREEDY)  # warm the cache
        batched = cached.generate(input_ids=prompts, sampling_params=GREEDY)
        for p, b in zip(prompts, batched):
            alone = uncached.generate(input_ids=p, sampling_params=GREEDY)
            assert alone["output_ids"] == b["output_ids"]
        assert batched[0]["meta_info"]["cached_tokens"] >= 40
        assert uncached.get_server_info()["cached_tokens"] == 0
        cached.check_integrity()
        uncached.check_integrity()


def test_tiny_pool_evicts_then_preempts_and_everything_finishes_the_same():
    prompts = [ids(30, i) for i in range(6)]
    params = {"temperature": 0, "max_new_tokens": 20}
    big, _ = make()
    small, _ = make(120)
    with big, small:
        expected = big.generate(input_ids=prompts, sampling_params=params)
        got = small.generate(input_ids=prompts, sampling_params=params)
        assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
        info = small.get_server_info()
        assert info["preemptions"] > 0 and info["evicted_tokens"] > 0
        small.check_integrity()
        assert small.flush_cache()
        assert small.get_server_info()["pool_free_tokens"] == 120


def test_disabled_cache_keeps_the_tree_empty_and_frees_everything():
    engine, _ = make(500, disable_radix_cache=True)
    with engine:
        engine.generate(input_ids=[[1, 2, 3, 4, 5, i] for i in range(3)], sampling_params=GREEDY)
        info = engine.get_server_info()
        assert info["cached_tokens"] == 0 and info["pool_free_tokens"] == 500


def test_abort_of_a_running_request_frees_its_slots(engine):
    params = {"temperature": 0, "max_new_tokens": 1000}
    chunks = engine.generate(input_ids=ids(50, 3), sampling_params=params, stream=True, rid="x")
    first = next(chunks)
    engine.abort("x")
    last = list(chunks)[-1]
    assert first["meta_info"]["finish_reason"] is None
    assert last["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by request"}
    assert last["meta_info"]["completion_tokens"] < 1000
    engine.check_integrity()
    assert engine.get_server_info()["num_running_reqs"] == 0


def test_a_stream_left_early_aborts_its_request(engine):
    chunks = engine.generate("tell", {"temperature": 0, "max_new_tokens": 1000}, stream=True)
    next(chunks)
    chunks.close()
    engine.generate("x", {"max_new_tokens": 1})  # the abort is handled before this finishes
    assert engine.get_server_info()["num_running_reqs"] == 0
    engine.check_integrity()


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_policies_admit_in_their_order(policy):
    engine, runner = make(schedule_policy=policy, max_running_requests=1)
    with engine:
        warm = [9] * 40
        engine.generate(input_ids=warm, sampling_params={"max_new_tokens": 1})
        cold, hot = [1] * 40, warm + [1]
        before = len(runner.segments)
        engine.generate(input_ids=[cold, hot], sampling_params={"max_new_tokens": 1})
        first = runner.segments[before][0]
        # the hot prompt only computes its last token; the cold one all of its 40
        assert len(first.token_ids) == (1 if policy == "lpm" else 40)


def test_max_new_tokens_zero_prefills_and_caches_the_prompt(engine):
    prompt = ids(30, 5)
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    again = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == len(prompt) - 1


def test_streamed_text_is_final_and_adds_up_to_the_result(engine):
    prompt = ids(20, 6)
    full = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 30})
    stop = full["text"][10:12]
    params = {**GREEDY, "max_new_tokens": 30, "stop": [stop]}
    final = engine.generate(input_ids=prompt, sampling_params=params)
    chunks = list(engine.generate(input_ids=prompt, sampling_params=params, stream=True))
    assert final["text"] == full["text"][: full["text"].index(stop)]
    assert all(final["text"].startswith(c["text"]) for c in chunks)
    assert chunks[-1]["text"] == final["text"]
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_regex_is_trimmed_and_reported_unless_no_stop_trim(engine):
    prompt = ids(20, 7)
    full = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 30})
    pattern = f"{full['text'][8]}[a-z]{full['text'][10]}"
    params = {**GREEDY, "max_new_tokens": 30, "stop_regex": pattern}
    out = engine.generate(input_ids=prompt, sampling_params=params)
    import re

    m = re.search(pattern, full["text"])
    assert out["text"] == full["text"][: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = engine.generate(input_ids=prompt, sampling_params={**params, "no_stop_trim": True})
    assert kept["text"] == full["text"][: m.end()]


def test_input_and_output_logprobs_line_up_with_the_fake_logits(engine):
    prompt = ids(12, 8)
    runner = engine.runner
    out = engine.generate(
        input_ids=prompt,
        sampling_params={"temperature": 0, "max_new_tokens": 2},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
    )
    meta = out["meta_info"]
    entries = meta["input_token_logprobs"]
    assert len(entries) == len(prompt) and entries[0] == [None, prompt[0], None]
    for pos in range(1, len(prompt)):
        expect = torch.log_softmax(runner.logits(prompt[:pos]), -1)[prompt[pos]].item()
        assert entries[pos][1] == prompt[pos] and abs(entries[pos][0] - expect) < 1e-5
    first = torch.log_softmax(runner.logits(prompt), -1)
    assert meta["output_token_logprobs"][0][1] == out["output_ids"][0] == first.argmax().item()
    assert abs(meta["output_token_logprobs"][0][0] - first.max().item()) < 1e-5
    assert [len(t) for t in meta["output_top_logprobs"]] == [2, 2]


def test_seeded_sampling_repeats_and_the_global_rng_is_untouched(engine):
    state = torch.random.get_rng_state()
    params = {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 3}
    a = engine.generate("seed", params)
    b = engine.generate("seed", params)
    assert a["output_ids"] == b["output_ids"]
    engine.generate("free", {"temperature": 1.0, "max_new_tokens": 4})
    assert torch.equal(torch.random.get_rng_state(), state)


def test_async_generate_needs_no_thread_per_request(engine):
    import asyncio
    import threading

    async def main():
        before = threading.active_count()
        results = await asyncio.gather(*[engine.async_generate(f"p{i}", GREEDY) for i in range(8)])
        stream = await engine.async_generate("p0", GREEDY, stream=True)
        chunks = [c async for c in stream]
        return before, results, chunks

    before, results, chunks = asyncio.run(main())
    assert threading.active_count() <= before + 1
    assert chunks[-1]["text"] == results[0]["text"] and len(chunks) == 6


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"input_ids": [1, 10**6]}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"bogus": 1}}, "sampling_params"),
        ({"prompt": "hi", "sampling_params": {"stop_regex": "("}}, "stop_regex"),
        ({"prompt": "hi", "top_logprobs_num": -1}, "top_logprobs_num"),
    ],
)
def test_bad_input_is_refused_with_its_field_and_nothing_leaks(engine, kwargs, field):
    before = engine.get_server_info()["pool_free_tokens"]
    with pytest.raises(InvalidRequest) as err:
        engine.generate(**kwargs)
    assert err.value.field == field
    assert engine.get_server_info()["pool_free_tokens"] == before
    assert engine.generate("ok", {"max_new_tokens": 2})["output_ids"]


def test_a_failing_step_aborts_the_batch_with_an_engine_error_and_the_engine_goes_on(engine):
    from sgl_lite.backend.errors import EngineError
    from sgl_lite.backend.types import ReqOutput

    runner = engine.runner
    forward = runner.forward
    calls = {"n": 0}

    def flaky(segments):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device lost")
        return forward(segments)

    runner.forward = flaky
    got: list[ReqOutput] = []
    import queue

    outputs: queue.SimpleQueue[ReqOutput] = queue.SimpleQueue()
    engine.submit(GenerateInput(prompt="abc", sampling_params={"max_new_tokens": 50}), outputs.put)
    while not (out := outputs.get()).finished:
        got.append(out)
    assert out.finish_reason.type == "abort" and isinstance(out.finish_reason.error, EngineError)
    assert "device lost" in out.finish_reason.message
    engine.check_integrity()
    assert engine.generate("ok", {"max_new_tokens": 3})["meta_info"]["completion_tokens"] == 3


def test_shutdown_answers_every_pending_request_with_an_abort():
    import queue

    from sgl_lite.backend.errors import EngineError

    engine, _ = make()
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    engine.submit(
        GenerateInput(prompt="long", sampling_params={"max_new_tokens": 2000}), outputs.put
    )
    engine.shutdown()
    while not (out := outputs.get(timeout=10)).finished:
        pass
    assert isinstance(out.finish_reason.error, EngineError)
    with pytest.raises(EngineError, match="shut down"):
        engine.generate("late")

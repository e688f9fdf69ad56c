"""The vLLM peer's protocol against bench/vllm_worker.py over a stand-in `vllm` module
(tests/support/fake_vllm_worker.py) in a child process."""

from __future__ import annotations

import pytest

from bench.common import Skipped, decide, select_items
from bench.vllm_peer import choice_scores
from bench.workloads import build
from tests.support.fake_vllm_worker import fake_logprob
from tests.support.vllm_peer import CharTokenizer, fake_peer

# --- the protocol, over the stand-in ------------------------------------------------------------
WL = build(quick=True, conversations=2, json_items=2)


def test_w4_and_w1_figures_come_back_through_the_worker():
    peer = fake_peer()
    try:
        peer.warmup()
        w4 = peer.w4(WL)
        assert w4["batch_size"] == len(WL.decode_prompts)
        assert w4["batch1_tokens_per_s"] > 0 and w4["batch_tokens_per_s"] > 0
        assert "0.0-fake" in w4["weights"]
        w1 = peer.w1(WL)
        run = w1["_run"]
        assert [len(a) for a in run.answers] == [2, 2]  # 2 conversations x 2 turns
        # the second turn repeats the first turn's prompt: the stand-in's cache serves it
        assert 0 < w1["prompt_tokens_computed"] < w1["prompt_tokens_submitted"]
        assert w1["ttft_note"].startswith("no first-token time")
    finally:
        peer.shutdown()


def test_w3_sends_the_schema_and_checks_the_texts():
    peer = fake_peer()
    try:
        w3 = peer.w3(WL)
        assert w3["items"] == 2 and w3["texts"][0] == '{"name": "x", "schema": "given"}'
    finally:
        peer.shutdown()


def test_w2_scores_every_choice_with_and_without_cache_reads_to_the_same_decisions():
    wl = build(quick=True, questions=3)
    tokenizer = CharTokenizer()
    _, items = select_items(tokenizer, wl)
    expected = [
        decide([[fake_logprob(t) for t in c.ids[c.start :]] for c in it.choices])[0] for it in items
    ]
    prompts = [c.ids for it in items for c in it.choices]
    starts = [c.start for it in items for c in it.choices]
    peer = fake_peer()
    try:
        cold = peer.score(prompts, starts, cache_reads=False)
        assert all(o["cached"] == 0 for o in cold["outputs"])  # vLLM's default: no reads
        peer._fresh()
        warm = peer.score(prompts, starts, cache_reads=True)
        assert sum(o["cached"] for o in warm["outputs"]) > 0  # the shared prefix was read
        for reply in (cold, warm):
            assert [decide(s)[0] for s in choice_scores(items, reply["outputs"])] == expected
        w2 = peer.w2(wl)
        assert w2["decisions"] == expected and w2["decisions_agree_across_modes"]
        assert w2["accuracy"] == sum(d == it.answer for d, it in zip(expected, items)) / 3
        assert w2["wall_s"] == min(w2["wall_s_no_cache_reads"], w2["wall_s_cache_reads"])
        assert "skip_reading_prefix_cache" in w2["cache_note"]
        # two choices that share their first token: the second's cache hit reaches into it,
        # so the worker scores it again without reads rather than return a stale logprob
        peer._fresh()
        shared = peer.score([[1, 2, 3, 4], [1, 2, 3, 5]], [2, 2], cache_reads=True)
        assert shared["rescored"] == 1 and shared["outputs"][1]["cached"] == 0
        assert shared["outputs"][1]["logprobs"] == [fake_logprob(3), fake_logprob(5)]
    finally:
        peer.shutdown()


def test_a_worker_that_cannot_load_the_model_is_skipped_with_its_error():
    with pytest.raises(Skipped, match="no CPU kernels for this ISA"):
        fake_peer("fail-start")


def test_a_worker_killed_mid_call_is_skipped_naming_the_signal_and_stays_skipped():
    peer = fake_peer("segv")
    try:
        with pytest.raises(Skipped, match="crashed during generate .killed by SIGSEGV"):
            peer.generate([[666]], 2)
        with pytest.raises(Skipped, match="SIGSEGV"):
            peer.w4(WL)
    finally:
        peer.shutdown()

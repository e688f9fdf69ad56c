"""The vLLM peer without vLLM: its pure helpers, and its protocol against bench/vllm_worker.py
over a stand-in `vllm` module (tests/bench/fake_vllm_worker.py) in a child process."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench import vllm_peer
from bench.common import ChoiceIds, SelectItem, Skipped, decide, select_items
from bench.vllm_peer import (
    VllmPeer,
    cache_figures,
    choice_scores,
    exit_reason,
    log_tail,
    parse_reply,
    w2_cache_note,
    worker_env,
)
from bench.vllm_worker import choice_logprobs
from bench.workloads import build
from tests.bench.fake_vllm_worker import fake_logprob

FAKE = Path(__file__).with_name("fake_vllm_worker.py")


class CharTokenizer:
    """Token id = byte value; a chat template that just joins the turns."""

    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i >= 32).decode(errors="replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def _peer(mode: str = "ok") -> VllmPeer:
    return VllmPeer(1, CharTokenizer(), Path(mode), python=sys.executable, worker=FAKE)


# --- pure helpers -------------------------------------------------------------------------------
def test_worker_env_pins_the_threads_and_drops_our_python_path():
    env = worker_env(2, {"PYTHONPATH": "/work/main", "VIRTUAL_ENV": "/x", "HOME": "/root"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["OMP_NUM_THREADS"] == "2"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(vllm_peer.KV_CACHE_GIB)
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env and env["HOME"] == "/root"
    assert worker_env(1, {})["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_parse_reply_refuses_what_is_not_a_json_object():
    assert parse_reply('{"ok": true}\n') == {"ok": True}
    with pytest.raises(RuntimeError, match="not JSON"):
        parse_reply("INFO 12-03 loading weights\n")
    with pytest.raises(RuntimeError, match="list, not an object"):
        parse_reply("[1, 2]")


def test_exit_reason_names_a_signal_or_a_status():
    assert exit_reason(-11) == "killed by SIGSEGV"
    assert exit_reason(3) == "exited with status 3"
    assert exit_reason(None) == "still running"


def test_log_tail_keeps_the_last_non_blank_lines():
    assert log_tail("a\n\nb\nc\n  \nd\n") == "b | c | d"
    assert log_tail("") == ""


def test_cache_figures_count_what_the_prefix_cache_served():
    assert cache_figures([[1, 2, 3], [1, 2]], [{"cached": 2}, {"cached": None}]) == (5, 3)


def test_a_missing_venv_is_skipped_with_how_to_install_it(tmp_path):
    with pytest.raises(Skipped, match="make bench-vllm"):
        VllmPeer(1, CharTokenizer(), tmp_path, python=tmp_path / "no-python")


def _logprobs(ids: list[int], stale_through: int = 0) -> list:
    """vLLM-shaped prompt logprobs: None first, then {token: Logprob}; stale where cached."""
    return [None] + [
        {t: types.SimpleNamespace(logprob=99.0 if i <= stale_through else -i / 10)}
        for i, t in enumerate(ids[1:], 1)
    ]


def test_choice_logprobs_reads_the_choice_tokens_given_what_precedes_them():
    ids = [5, 6, 7, 8, 9]
    assert choice_logprobs(_logprobs(ids), ids, 3, 0) == [-0.3, -0.4]
    # a cache hit of 2 tokens: entries past it are fresh, so a choice from 3 can be read
    assert choice_logprobs(_logprobs(ids, stale_through=2), ids, 3, 2) == [-0.3, -0.4]


def test_choice_logprobs_refuses_a_cache_hit_that_reaches_the_choice():
    ids = [5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="3 cached tokens cover the choice from 3"):
        choice_logprobs(_logprobs(ids, stale_through=3), ids, 3, 3)


def test_choice_logprobs_refuses_logprobs_that_do_not_match_the_prompt():
    ids = [5, 6, 7]
    with pytest.raises(ValueError, match="2 prompt logprobs for a 3-token prompt"):
        choice_logprobs(_logprobs(ids)[:2], ids, 1, 0)
    with pytest.raises(ValueError, match="no logprob of prompt token 7 at position 2"):
        choice_logprobs(_logprobs([5, 6, 4]), ids, 1, 0)
    with pytest.raises(ValueError, match="outside a 3-token prompt"):
        choice_logprobs(_logprobs(ids), ids, 0, 0)


def _item(*choices: tuple[int, int]) -> SelectItem:
    return SelectItem([1, 2], [ChoiceIds(list(range(n)), s) for n, s in choices], [], 0)


def test_choice_scores_regroups_the_flat_outputs_by_question():
    items = [_item((4, 2), (3, 2)), _item((5, 2))]
    outputs = [{"logprobs": [-1, -2]}, {"logprobs": [-0.5]}, {"logprobs": [-1, -1, -1]}]
    scores = choice_scores(items, outputs)
    assert scores == [[[-1.0, -2.0], [-0.5]], [[-1.0, -1.0, -1.0]]]
    assert decide(scores[0]) == (1, [-1.5, -0.5])  # length-normalised: the short choice wins


def test_choice_scores_refuses_a_reply_that_does_not_fit_the_items():
    with pytest.raises(RuntimeError, match="scored 1 prompts, 2 were sent"):
        choice_scores([_item((4, 2), (3, 2))], [{"logprobs": [-1, -2]}])
    with pytest.raises(RuntimeError, match="1 logprobs for a 2-token choice"):
        choice_scores([_item((4, 2))], [{"logprobs": [-1]}])


def test_w2_cache_note_says_what_vllm_skips_and_which_mode_is_the_figure():
    runs = {
        "no_cache_reads": {"wall_s": 2.0, "computed": 100, "submitted": 100},
        "cache_reads": {"wall_s": 1.0, "computed": 40, "submitted": 100, "rescored": 1},
    }
    note = w2_cache_note(runs, "cache_reads")
    assert "skip_reading_prefix_cache defaults to True" in note
    assert "no_cache_reads 2 s, 100 of 100" in note and "40 of 100 prompt tokens computed" in note
    assert "1 rescored" in note and note.endswith("the faster (cache_reads)")


# --- the protocol, over the stand-in ------------------------------------------------------------
WL = build(quick=True, conversations=2, json_items=2)


@pytest.mark.process
def test_w4_and_w1_figures_come_back_through_the_worker():
    peer = _peer()
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


@pytest.mark.process
def test_w3_sends_the_schema_and_checks_the_texts():
    peer = _peer()
    try:
        w3 = peer.w3(WL)
        assert w3["items"] == 2 and w3["texts"][0] == '{"name": "x", "schema": "given"}'
    finally:
        peer.shutdown()


@pytest.mark.process
def test_w2_scores_every_choice_with_and_without_cache_reads_to_the_same_decisions():
    wl = build(quick=True, questions=3)
    tokenizer = CharTokenizer()
    _, items = select_items(tokenizer, wl)
    expected = [
        decide([[fake_logprob(t) for t in c.ids[c.start :]] for c in it.choices])[0] for it in items
    ]
    prompts = [c.ids for it in items for c in it.choices]
    starts = [c.start for it in items for c in it.choices]
    peer = _peer()
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


@pytest.mark.process
def test_a_worker_that_cannot_load_the_model_is_skipped_with_its_error():
    with pytest.raises(Skipped, match="no CPU kernels for this ISA"):
        _peer("fail-start")


@pytest.mark.process
def test_a_worker_killed_mid_call_is_skipped_naming_the_signal_and_stays_skipped():
    peer = _peer("segv")
    try:
        with pytest.raises(Skipped, match="crashed during generate .killed by SIGSEGV"):
            peer.generate([[666]], 2)
        with pytest.raises(Skipped, match="SIGSEGV"):
            peer.w4(WL)
    finally:
        peer.shutdown()


def test_worker_env_preloads_the_venvs_openmp_before_what_was_there():
    env = worker_env(1, {"LD_PRELOAD": "/lib/x.so"}, preload=Path("/v/lib/libiomp5.so"))
    assert env["LD_PRELOAD"] == "/v/lib/libiomp5.so /lib/x.so"
    assert "LD_PRELOAD" not in worker_env(1, {})

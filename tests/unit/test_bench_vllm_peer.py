"""The vLLM peer's pure helpers, without vLLM (its protocol over a child process:
tests/process/test_bench_vllm_worker.py)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from bench import vllm_peer
from bench.common import ChoiceIds, SelectItem, Skipped, decide
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
from tests.support.vllm_peer import CharTokenizer


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


def test_worker_env_preloads_the_venvs_openmp_before_what_was_there():
    env = worker_env(1, {"LD_PRELOAD": "/lib/x.so"}, preload=Path("/v/lib/libiomp5.so"))
    assert env["LD_PRELOAD"] == "/v/lib/libiomp5.so /lib/x.so"
    assert "LD_PRELOAD" not in worker_env(1, {})

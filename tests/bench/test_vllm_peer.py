"""The vLLM peer without vLLM: its pure helpers, and its protocol against bench/vllm_worker.py
over a stand-in `vllm` module (tests/bench/fake_vllm_worker.py) in a child process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import vllm_peer
from bench.common import Skipped
from bench.vllm_peer import VllmPeer, cache_figures, exit_reason, log_tail, parse_reply, worker_env
from bench.workloads import build

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

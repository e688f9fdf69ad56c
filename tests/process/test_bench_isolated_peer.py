"""A peer in its own process: its results come back, its crash becomes a skipped row."""

from __future__ import annotations

import os
import signal

import pytest

from bench.common import Skipped
from bench.isolated import IsolatedPeer
from bench.run import measure

OPTIONS = {"quick": True, "conversations": 1, "questions": 1, "json_items": 1}


class _FakePeer:
    def __init__(self, crash_in: str | None) -> None:
        self.crash_in = crash_in

    def warmup(self) -> None:
        if self.crash_in == "warmup":
            os.kill(os.getpid(), signal.SIGSEGV)

    def w4(self, wl) -> dict:
        if self.crash_in == "w4":
            os.kill(os.getpid(), signal.SIGSEGV)
        return {"batch1_tokens_per_s": 42.0, "prompt_words": len(wl.decode_prompt.split())}


def good_peer(options):
    return _FakePeer(None)


def crashing_peer(options):
    return _FakePeer("w4")


def crashing_warmup_peer(options):
    return _FakePeer("warmup")


class _EnvPeer:
    def w4(self, wl) -> dict:
        return {"omp_wait_policy": os.environ.get("GOMP_SPINCOUNT", "")}


def env_peer(options):
    return _EnvPeer()


def missing_peer(options):
    raise Skipped("fake_peer not importable")


def test_results_come_back_and_only_the_peers_own_methods_exist():
    peer = IsolatedPeer(f"{__name__}:good_peer", 1, OPTIONS)
    try:
        peer.warmup()
        figs = measure(peer, "w4", None, repeats=2)
        assert figs["batch1_tokens_per_s"] == 42.0 and figs["prompt_words"] > 10
        assert not hasattr(peer, "w1")
    finally:
        peer.shutdown()


@pytest.mark.parametrize("factory", ["crashing_peer", "crashing_warmup_peer"])
def test_a_segfault_becomes_a_skipped_row_naming_the_signal(factory):
    peer = IsolatedPeer(f"{__name__}:{factory}", 1, OPTIONS)
    try:
        peer.warmup()
        figs = measure(peer, "w4", None, repeats=2)
        assert "SIGSEGV" in figs["skipped"] and "crashed" in figs["skipped"]
    finally:
        peer.shutdown()


def test_a_peer_that_cannot_start_is_skipped_with_its_reason():
    with pytest.raises(Skipped, match="fake_peer not importable"):
        IsolatedPeer(f"{__name__}:missing_peer", 1, OPTIONS)


def test_a_peer_starts_without_the_wait_policy_sgl_lite_set_for_itself(monkeypatch):
    from sgl_lite.backend import omp_policy

    monkeypatch.setattr(omp_policy, "_state", "set")
    monkeypatch.setenv(omp_policy.DEFAULT_KNOB, omp_policy.DEFAULT_VALUE)
    peer = IsolatedPeer(f"{__name__}:env_peer", 1, OPTIONS)
    try:
        assert peer.w4(None) == {"omp_wait_policy": ""}
    finally:
        peer.shutdown()
    assert os.environ[omp_policy.DEFAULT_KNOB] == omp_policy.DEFAULT_VALUE  # ours is restored

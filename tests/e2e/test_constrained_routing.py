"""`auto` routing: the up-front index-cost estimate sends costly patterns to llguidance, and an
automaton build that fails or runs past half the timeout falls back to llguidance (the
abandoned build at nice 19 until the timeout stops it, never started twice for one pattern);
automaton indexes build in worker processes that a timeout kills."""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import pytest

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from sgl_lite.backend.constrained import compiler as compiler_module
from sgl_lite.backend.constrained.automaton.cost import IndexCost, index_cost
from sgl_lite.backend.constrained.automaton.index_worker import BuildStopped, IndexWorkers
from sgl_lite.backend.constrained.vocab import byte_vocabulary
from tests.support.smollm import smollm2_tokenizer

pytestmark = pytest.mark.tokenizer

LONG_STRING = {"type": "string", "minLength": 1, "maxLength": 1024}
WORDS = r'"[\w\d\s]*"'  # SGLang's test_decode_json_regex
NUMBER = r"[-+]?[0-9]+[ \n]*"


def test_cost_estimate_separates_cheap_and_costly_patterns() -> None:
    assert index_cost(WORDS).expensive  # Unicode \w
    assert not index_cost(NUMBER).expensive
    assert not index_cost(r"(yes|no)").expensive
    bounded = r'"([^"\\]|\\["\\/bfnrt]){0,64}"'
    assert index_cost(bounded).expensive and not index_cost(r'"([^"\\]|\\["\\/bfnrt])*"').expensive
    assert index_cost("a" * 5000).expensive  # a large schema's regex


@pytest.mark.parametrize(
    ("kind", "pattern", "backend"),
    [
        ("json_schema", LONG_STRING, "llguidance"),
        ("regex", WORDS, "llguidance"),
        ("regex", NUMBER, "outlines"),  # cheap: the automaton (exact budget rule) builds it
    ],
)
def test_auto_routes_by_the_estimate_and_compiles(kind: str, pattern: Any, backend: str) -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=60.0)
    assert compiler.plan(kind, pattern)[0] == backend
    grammar = compiler.compile(kind, pattern)
    assert grammar.backend == backend
    guide = grammar.new_guide(max_new_tokens=64)
    assert bool(guide.allowed_mask().any())


SLOW = r"[\w\d\s]{0,200}"  # its index takes minutes (Unicode classes, a long bound)


def _failing_automaton(compiler: GrammarCompiler) -> Any:
    """A `_build_grammar` whose automaton builds fail; llguidance builds run as they are."""
    real = compiler.builds._build_grammar

    def build(backend: str, source: str, *rest: Any) -> Any:
        if backend == "outlines":
            raise GrammarError("simulated automaton failure")
        return real(backend, source, *rest)

    return build


def _gone(pid: int, within_s: float) -> bool:
    """Whether process `pid` has exited (and been reaped) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def _job_pid(compiler: GrammarCompiler, started: list[int]) -> None:
    """Records the pid of every index job the compiler starts into `started`."""
    real = compiler.index_workers.start

    def start(regex: str) -> Any:
        job = real(regex)
        started.append(job.pid)
        return job

    compiler.builds.index_workers.start = start  # type: ignore[method-assign]


@pytest.mark.timeout(60)
def test_a_build_past_half_the_timeout_falls_back_runs_at_nice_19_and_stops_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE: the estimate would send SLOW to llguidance; here it is made to pick the automaton
    monkeypatch.setattr(compiler_module, "index_cost", lambda *_: IndexCost(1.0, 0.0, 0.0, None))
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=4.0, cache_size=1)
    pids: list[int] = []
    _job_pid(compiler, pids)
    assert compiler.plan("regex", SLOW)[0] == "outlines"
    started = time.monotonic()
    grammar = compiler.compile("regex", SLOW)  # served at half the timeout, not failed
    assert grammar.backend == "llguidance"
    [pid] = pids
    assert os.getpriority(os.PRIO_PROCESS, pid) == 19  # the abandoned build runs on, lowest
    assert _gone(pid, within_s=4.0 - (time.monotonic() - started) + 3.0)  # stopped at 4 s
    compiler.compile("regex", "x|y")  # evicts the pattern (cache_size 1)
    again = compiler.compile("regex", SLOW)
    assert again.backend == "llguidance"
    assert len(pids) == 2  # "x|y" only: the automaton of SLOW was not started a second time


@pytest.mark.timeout(60)
def test_a_timed_out_build_is_stopped_not_left_running() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=1.0)
    pids: list[int] = []
    _job_pid(compiler, pids)
    with pytest.raises(GrammarError, match="timed out after 1.0 s"):
        compiler.compile("regex", SLOW)
    assert _gone(pids[0], within_s=3.0)
    assert compiler.compile("regex", "(ab|cd)e").backend == "outlines"  # a new worker serves


def test_a_failed_automaton_build_falls_back_under_auto_only() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=30.0)
    compiler.builds._build_grammar = _failing_automaton(compiler)  # type: ignore[method-assign]
    assert compiler.compile("regex", r"(ab|cd)f").backend == "llguidance"
    pinned = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=30.0)
    pinned.builds._build_grammar = _failing_automaton(pinned)  # type: ignore[method-assign]
    with pytest.raises(GrammarError, match="simulated automaton failure"):
        pinned.compile("regex", r"(ab|cd)f")


def test_a_worker_that_dies_is_a_failed_build_and_the_next_build_gets_a_new_one() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=30.0)
    job = compiler.index_workers.start(SLOW)
    os.kill(job.pid, signal.SIGKILL)
    with pytest.raises(BuildStopped, match="died") as died:
        job.result()
    assert not died.value.stopped
    assert compiler.compile("regex", r"(ab|cd)g").backend == "outlines"


@pytest.mark.parametrize("executable", ["/nonexistent/python", shutil.which("false") or "false"])
def test_without_worker_processes_indexes_build_in_thread(
    executable: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No interpreter at all, or one that is not this Python (it exits before answering)."""
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=30.0)
    compiler.builds.index_workers = IndexWorkers(
        (compiler.vocab.index_vocab, byte_vocabulary()), executable=executable
    )
    for pattern in (r"(ab|cd)h", r"(ab|cd)i"):
        grammar = compiler.compile("regex", pattern)
        assert grammar.backend == "outlines"
        assert bool(grammar.new_guide(max_new_tokens=8).allowed_mask().any())
    assert "indexes build in-thread" in caplog.text
    assert compiler.index_workers.unavailable
    assert compiler.index_workers.started <= 1  # given up at the first failure

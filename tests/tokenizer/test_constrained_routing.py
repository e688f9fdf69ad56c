"""The routing table (compiler.ROUTES) and its named rules: under `auto` a regex goes to the
automaton and a schema or grammar to llguidance; a schema llguidance refuses goes to the
automaton where it serves it exactly; the any-object schema goes to llguidance. Automaton
indexes build in worker processes that a timeout kills."""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import pytest

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from sgl_lite.backend.constrained.automaton.index_worker import BuildStopped, IndexWorkers
from sgl_lite.backend.constrained.compiler import ROUTES
from sgl_lite.backend.constrained.vocab import byte_vocabulary
from tests.support.smollm import smollm2_tokenizer

WORDS = r'"[\w\d\s]*"'  # SGLang's test_decode_json_regex, and the frontend's dtype=str regex
NUMBER = r"[-+]?[0-9]+[ \n]*"
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ARITHMETIC = 'root ::= num (("+" | "*") num)*\nnum ::= [0-9]+'


@pytest.mark.parametrize(
    ("kind", "pattern", "backend"),
    [
        ("regex", NUMBER, "outlines"),
        ("regex", WORDS, "outlines"),  # no cost guess: a regex is the automaton's
        ("json_schema", OBJECT, "llguidance"),
        ("json_schema", {"type": "string", "maxLength": 1024}, "llguidance"),
        ("ebnf", ARITHMETIC, "llguidance"),
    ],
)
def test_auto_routes_by_the_table_and_compiles(
    auto: GrammarCompiler, kind: str, pattern: Any, backend: str
) -> None:
    assert ROUTES["auto"][kind] == backend
    assert auto.plan(kind, pattern)[0] == backend
    grammar = auto.compile(kind, pattern)
    assert grammar.backend == backend
    assert bool(grammar.new_guide(max_new_tokens=64).allowed_mask().any())


def test_a_pinned_backend_takes_every_kind_it_can_express() -> None:
    for backend in ("llguidance", "xgrammar"):
        assert set(ROUTES[backend].values()) == {backend}
    outlines = GrammarCompiler(smollm2_tokenizer(), backend="outlines")
    assert outlines.plan("json_schema", OBJECT)[0] == "outlines"
    assert outlines.plan("ebnf", ARITHMETIC)[0] == "llguidance"  # no grammar on an automaton


def test_any_object_goes_to_llguidance_under_outlines_too() -> None:
    """Named rule ANY_OBJECT: the automaton writes only a bounded subset of any JSON object."""
    outlines = GrammarCompiler(smollm2_tokenizer(), backend="outlines")
    assert outlines.plan("json_schema", {"type": "object"})[0] == "llguidance"


@pytest.mark.parametrize(
    "schema",
    [
        {"maximum": 18446744073709551615},  # a bound past 64 bits (the suite's bignum.json)
        {  # a `$schema` metaschema llguidance would fetch (the suite's vocabulary.json)
            "$schema": "http://localhost:1234/draft2020-12/metaschema-no-validation.json",
            "properties": {"numberProperty": {"minimum": 10}},
        },
    ],
)
def test_auto_gives_the_automaton_a_schema_llguidance_refuses(
    auto: GrammarCompiler, schema: dict[str, Any]
) -> None:
    """Named rule AUTOMATON_WHERE_LLGUIDANCE_REFUSES, for the classes measured on the JSON
    Schema Test Suite."""
    llguidance = GrammarCompiler(smollm2_tokenizer(), backend="llguidance")
    with pytest.raises(GrammarError):
        llguidance.validate("json_schema", schema)
    assert auto.plan("json_schema", schema)[0] == "outlines"


def test_a_schema_both_refuse_names_both_refusals(auto: GrammarCompiler) -> None:
    with pytest.raises(GrammarError, match="llguidance.*the automaton refuses it too.*'not'"):
        auto.validate("json_schema", {"not": {"type": "string"}})


SLOW = r"[\w\d\s]{0,200}"  # its index takes minutes (Unicode classes, a long bound)


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
def test_a_timed_out_build_is_stopped_not_left_running() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=1.0)
    pids: list[int] = []
    _job_pid(compiler, pids)
    with pytest.raises(GrammarError, match="timed out after 1.0 s"):
        compiler.compile("regex", SLOW)
    assert _gone(pids[0], within_s=3.0)
    assert compiler.compile("regex", "(ab|cd)e").backend == "outlines"  # a new worker serves


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

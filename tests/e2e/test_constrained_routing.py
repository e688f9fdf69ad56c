"""`auto` routing: the up-front index-cost estimate sends costly patterns to llguidance, and an
automaton build that fails or runs past half the timeout falls back to llguidance (the
abandoned build at nice 19, never started twice for one pattern)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from sgl_lite.backend.constrained.automaton.cost import index_cost
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


class _SlowAutomaton:
    """Wraps a compiler's `_build_grammar`: automaton builds wait for `release` (then record
    their thread's nice value and build for real, or fail); llguidance builds run as they are."""

    def __init__(self, compiler: GrammarCompiler, *, fail: bool = False) -> None:
        self.real = compiler._build_grammar
        self.release = threading.Event()
        self.done = threading.Event()
        self.calls: list[str] = []
        self.nice: int | None = None
        self.fail = fail

    def __call__(self, backend: str, source: str) -> Any:
        if backend != "outlines":
            return self.real(backend, source)
        self.calls.append(source)
        try:
            if self.fail:
                raise GrammarError("simulated automaton failure")
            self.release.wait(30)
            self.nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            return self.real(backend, source)
        finally:
            self.done.set()


def test_a_build_past_half_the_timeout_falls_back_and_is_never_started_twice() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=4.0, cache_size=1)
    slow = _SlowAutomaton(compiler)
    compiler._build_grammar = slow  # type: ignore[method-assign]
    pattern = r"(ab|cd)e"
    assert compiler.plan("regex", pattern)[0] == "outlines"
    grammar = compiler.compile("regex", pattern)  # served at half the timeout, not failed
    assert grammar.backend == "llguidance"
    slow.release.set()
    assert slow.done.wait(30)
    assert slow.nice == 19  # the abandoned build ran on at the lowest priority
    compiler.compile("regex", "x|y")  # evicts the pattern (cache_size 1)
    again = compiler.compile("regex", pattern)
    assert again.backend == "llguidance"
    assert slow.calls.count(pattern) == 1  # the automaton was not built a second time


def test_a_failed_automaton_build_falls_back_under_auto_only() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=30.0)
    compiler._build_grammar = _SlowAutomaton(compiler, fail=True)  # type: ignore[method-assign]
    assert compiler.compile("regex", r"(ab|cd)f").backend == "llguidance"
    pinned = GrammarCompiler(smollm2_tokenizer(), backend="outlines", timeout_s=30.0)
    pinned._build_grammar = _SlowAutomaton(pinned, fail=True)  # type: ignore[method-assign]
    with pytest.raises(GrammarError, match="simulated automaton failure"):
        pinned.compile("regex", r"(ab|cd)f")

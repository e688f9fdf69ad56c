"""Grammar builds off the caller's thread: one shared future per (backend, source), a timeout.

`GrammarBuilds.submit` starts a build on a thread of its own and caches its future, an LRU of
`cache_size`. A build longer than `timeout_s` fails the future with GrammarError; later
submissions of the pattern get the same failed future while it stays cached. An automaton index
is built in a worker process (automaton/index_worker.py) that is killed at the timeout: the
build is one uninterruptible call into outlines-core that runs seconds to minutes for some
regexes (Unicode classes under long bounded repeats), and a thread would burn a core until it
ended. GrammarCompiler (compiler.py) decides what is built; this module only builds it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from outlines_core import Index

from sgl_lite.backend.constrained.automaton.grammar import CompiledGrammar
from sgl_lite.backend.constrained.automaton.index_worker import (
    BuildStopped,
    IndexBuildError,
    IndexWorkers,
    WorkersUnavailable,
)
from sgl_lite.backend.constrained.compile_stats import CompileStats
from sgl_lite.backend.constrained.matchers.llguidance_backend import LLGrammar
from sgl_lite.backend.constrained.matchers.xgrammar_backend import XGGrammar
from sgl_lite.backend.constrained.protocols import Grammar
from sgl_lite.backend.constrained.regex_check import GrammarError
from sgl_lite.backend.constrained.vocab import TokenVocabulary, byte_vocabulary
from sgl_lite.backend.omp_threads import use_one_omp_thread


class GrammarBuilds:
    """The builds of one compiler: cached futures, their timeouts, the index workers, build
    times."""

    def __init__(
        self,
        tokenizer: Any,
        vocab: TokenVocabulary,
        *,
        timeout_s: float,
        cache_size: int,
        mask_cache_states: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.mask_cache_states = mask_cache_states
        self.budget_aware = True  # bench-only switch, see CompiledGrammar.budget_aware
        self._cache: OrderedDict[tuple[str, str], Future[Grammar]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CompileStats()  # every build's duration, for /metrics
        self.index_workers = IndexWorkers((vocab.index_vocab, byte_vocabulary()))
        weakref.finalize(self, self.index_workers.close)

    def submit(self, kind: str, backend: str, source: str) -> Future[Grammar]:
        """The shared future of `source`'s grammar on `backend`, a build started if none is
        cached. Never blocks."""
        key = (backend, source)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            future: Future[Grammar] = Future()
            future.set_running_or_notify_cancel()  # NOTE: shared, so no caller can cancel it
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        timer = threading.Timer(self.timeout_s, self._expire, args=(kind, future))
        timer.daemon = True
        timer.start()
        threading.Thread(
            target=self._build, args=(key, future, timer), name="grammar-compile", daemon=True
        ).start()
        return future

    def _build(self, key: tuple[str, str], future: Future[Grammar], timer: threading.Timer) -> None:
        use_one_omp_thread()  # no second OpenMP team beside the forward's (see omp_threads)
        started = time.perf_counter()
        outcome: Grammar | GrammarError
        try:
            outcome = self._build_grammar(*key)
        except GrammarError as exc:
            outcome = exc
        except Exception as exc:
            outcome = GrammarError(f"cannot compile the pattern into an automaton: {exc}")
        self.stats.record(time.perf_counter() - started, not isinstance(outcome, GrammarError))
        if isinstance(outcome, _Stopped):
            return  # killed at the timeout, whose own error settles the future
        timer.cancel()
        with self._lock:
            if future.done():  # timed out: the timeout's error stands
                return
            if isinstance(outcome, GrammarError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _build_grammar(self, backend: str, source: str) -> Grammar:
        if backend == "llguidance":
            return LLGrammar(source, self.tokenizer, self.vocab.size, self.vocab.eos_token_id)
        if backend == "xgrammar":
            return XGGrammar(source, self.tokenizer, self.vocab)
        index, byte_index = self._indexes(source)
        grammar = CompiledGrammar(
            source, index, byte_index, self.vocab, mask_cache_states=self.mask_cache_states
        )
        grammar.budget_aware = self.budget_aware
        start = grammar.initial_state
        if grammar.num_allowed(start) == 0 and not grammar.is_accepting(start):
            raise GrammarError("the pattern matches no text this tokenizer can produce")
        return grammar

    def _indexes(self, regex: str) -> tuple[Index, Index]:
        """The automaton's indexes of `regex` over the vocabulary and over bytes, built in a
        worker process that is killed at the timeout, or in this thread where no worker can
        start."""
        try:
            job = self.index_workers.start(regex)
        except WorkersUnavailable:
            return Index(regex, self.vocab.index_vocab), Index(regex, byte_vocabulary())
        deadline = threading.Timer(self.timeout_s, job.stop)
        deadline.daemon = True
        deadline.start()
        try:
            index, byte_index = job.result()
        except IndexBuildError as exc:
            raise GrammarError(f"cannot compile the pattern into an automaton: {exc}") from None
        except BuildStopped as exc:
            if exc.stopped:
                raise _Stopped(str(exc)) from None
            if self.index_workers.unavailable:  # no worker ever answered: none will
                return Index(regex, self.vocab.index_vocab), Index(regex, byte_vocabulary())
            raise GrammarError(f"cannot compile the pattern into an automaton: {exc}") from None
        finally:
            deadline.cancel()
        return index, byte_index

    def close(self) -> None:
        """Lets the idle index workers go (builds in flight end on their own)."""
        self.index_workers.close()

    def _expire(self, kind: str, future: Future[Grammar]) -> None:
        with self._lock:
            if not future.done():
                future.set_exception(
                    GrammarError(
                        f"{kind} compile timed out after {self.timeout_s} s; simplify the pattern "
                        "(long bounded repeats of Unicode classes such as \\w are slow to index), "
                        "or use grammar_backend 'llguidance', which builds lazily"
                    )
                )


class _Stopped(GrammarError):
    """An automaton build stopped at the timeout (the timeout's own error settles its future)."""

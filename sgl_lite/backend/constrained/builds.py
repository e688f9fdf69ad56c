"""Grammar builds off the caller's thread: one shared future per (backend, source), a timeout,
and `auto`'s fallback from the automaton to llguidance.

`GrammarBuilds.submit` starts a build on a thread of its own (an automaton's index in a worker
process, automaton/index_worker.py) and caches its future, an LRU of `cache_size`. A build
longer than `timeout_s` fails the future with GrammarError. Under "auto" an automaton build that
fails, or runs past half of `timeout_s`, is replaced by llguidance's build of the same pattern;
the abandoned build goes on at nice 19 until the timeout and, should it succeed by then, its
grammar replaces the cache entry (the exact budget rule for later requests), and it is never
started again for that source. An automaton build still running at the timeout is stopped (its
worker process killed); later submissions of the pattern get the same failed future while it
stays cached. GrammarCompiler (compiler.py) decides what is built; this module only builds it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from outlines_core import Index

from sgl_lite.backend.constrained.automaton.grammar import CompiledGrammar
from sgl_lite.backend.constrained.automaton.index_worker import (
    BuildStopped,
    IndexBuildError,
    IndexJob,
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

ABANDONED_NICE = 19  # an automaton build "auto" stopped waiting for runs at the lowest priority
MAX_REMEMBERED = 1024  # patterns whose automaton build "auto" gave up on, remembered for good


class GrammarBuilds:
    """The builds of one compiler: cached futures, timers, the index workers, build times.

    `llguidance_source(kind, pattern)` is the compiler's llguidance grammar for a prepared
    pattern (the fallback's source; GrammarError if refused)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab: TokenVocabulary,
        *,
        timeout_s: float,
        cache_size: int,
        mask_cache_states: int,
        llguidance_source: Callable[[str, Any], str],
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.mask_cache_states = mask_cache_states
        self.budget_aware = True  # bench-only switch, see CompiledGrammar.budget_aware
        self._llguidance_source = llguidance_source
        self._cache: OrderedDict[tuple[str, str], Future[Grammar]] = OrderedDict()
        # automaton sources "auto" no longer builds (a build failed or was abandoned)
        self._no_automaton: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CompileStats()  # every build's duration, for /metrics
        self.index_workers = IndexWorkers((vocab.index_vocab, byte_vocabulary()))
        weakref.finalize(self, self.index_workers.close)

    def gave_up_on(self, source: str) -> bool:
        """Whether "auto" builds this automaton source with llguidance for good."""
        with self._lock:
            return source in self._no_automaton

    def submit(
        self, kind: str, backend: str, source: str, fallback: tuple[str, Any] | None
    ) -> Future[Grammar]:
        """The shared future of `source`'s grammar on `backend`, a build started if none is
        cached; `fallback` (auto, automaton): the prepared pattern llguidance builds instead
        if the automaton's build fails or runs past half the timeout. Never blocks."""
        key = (backend, source)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            future: Future[Grammar] = Future()
            future.set_running_or_notify_cancel()  # NOTE: shared, so no caller can cancel it
            self._put(key, future)
        build = _Build(kind, key, future, fallback)
        build.timers.append(threading.Timer(self.timeout_s, self._expire, args=(kind, future)))
        if fallback is not None:
            build.timers.append(threading.Timer(self.timeout_s / 2, self._abandon, args=(build,)))
        worker = threading.Thread(
            target=self._build, args=(build,), name="grammar-compile", daemon=True
        )
        for timer in build.timers:
            timer.daemon = True
            timer.start()
        worker.start()
        return future

    def _build(self, build: _Build) -> None:
        use_one_omp_thread()  # no second OpenMP team beside the forward's (see omp_threads)
        with self._lock:
            build.tid = threading.get_native_id()
            abandoned = build.abandoned
            skip = build.fallback is not None and build.key[1] in self._no_automaton
        if abandoned:
            _lower_priority(build.tid)
        if skip:  # an earlier build of it failed or was abandoned: never build it again
            self._build_fallback(build)
            return
        outcome = self._attempt(*build.key, build=build)
        if isinstance(outcome, _Stopped):  # at the timeout, which failed or served the future
            with self._lock:
                build.running -= 1
            return
        if isinstance(outcome, GrammarError) and build.fallback is not None:
            with self._lock:
                self._give_up_automaton(build.key[1])
                retry = not build.abandoned  # else the fallback is already being built
            if retry:
                self._build_fallback(build, failed=outcome)
                return
        self._settle(build, outcome, automaton=True)

    def _attempt(
        self, backend: str, source: str, build: _Build | None = None
    ) -> Grammar | GrammarError:
        """One build, timed into `stats`; its GrammarError (or any error, as one) returned."""
        started = time.perf_counter()
        outcome: Grammar | GrammarError
        try:
            outcome = self._build_grammar(backend, source, build)
        except GrammarError as exc:
            outcome = exc
        except Exception as exc:
            outcome = GrammarError(f"cannot compile the pattern into an automaton: {exc}")
        self.stats.record(time.perf_counter() - started, not isinstance(outcome, GrammarError))
        return outcome

    def _abandon(self, build: _Build) -> None:
        """Half the timeout has passed on an automaton build: lower its priority, remember
        never to start it again, and build llguidance's grammar for the future instead."""
        with self._lock:
            if build.future.done() or build.abandoned:
                return
            build.abandoned = True
            build.running += 1  # the fallback's attempt beside the automaton's
            self._give_up_automaton(build.key[1])
            tid, job = build.tid, build.job
        if job is not None:
            job.lower_priority(ABANDONED_NICE)
        elif tid is not None:
            _lower_priority(tid)
        threading.Thread(
            target=self._build_fallback, args=(build,), name="grammar-fallback", daemon=True
        ).start()

    def _build_fallback(self, build: _Build, failed: GrammarError | None = None) -> None:
        """llguidance's grammar for the pattern of `build` (its automaton build failed with
        `failed`, or was abandoned), settled into its future."""
        use_one_omp_thread()
        assert build.fallback is not None
        kind, pattern = build.fallback
        try:
            source = self._llguidance_source(kind, pattern)
        except GrammarError as exc:
            outcome: Grammar | GrammarError = exc
        else:
            outcome = self._attempt("llguidance", source)
        if isinstance(outcome, GrammarError) and failed is not None:
            outcome = GrammarError(f"{failed}; llguidance cannot build it either: {outcome}")
        self._settle(build, outcome, automaton=False)

    def _settle(self, build: _Build, outcome: Grammar | GrammarError, *, automaton: bool) -> None:
        """Resolves the future of `build` with `outcome`, or, when it is already resolved
        (timed out, or served by the fallback), keeps a late result in the cache: a late
        automaton always, anything over a timeout error."""
        failed = isinstance(outcome, GrammarError)
        with self._lock:
            build.running -= 1
            future = build.future
            if not future.done():
                if failed and build.running > 0:
                    return  # the other attempt (automaton or fallback) may still succeed
                target = future
            elif self._cache.get(build.key) is future and (
                (automaton and not failed) or future.exception() is not None
            ):
                target = Future()
                target.set_running_or_notify_cancel()
                self._put(build.key, target)
            else:
                return
            if isinstance(outcome, GrammarError):
                target.set_exception(outcome)
            else:
                target.set_result(outcome)
        if target is future:
            for timer in build.timers:
                timer.cancel()

    def _give_up_automaton(self, source: str) -> None:
        """Remembers (caller holds the lock) that "auto" builds `source` with llguidance."""
        self._no_automaton[source] = None
        while len(self._no_automaton) > MAX_REMEMBERED:
            self._no_automaton.popitem(last=False)

    def _build_grammar(self, backend: str, regex: str, build: _Build | None = None) -> Grammar:
        if backend == "llguidance":
            return LLGrammar(regex, self.tokenizer, self.vocab.size, self.vocab.eos_token_id)
        if backend == "xgrammar":
            return XGGrammar(regex, self.tokenizer, self.vocab)
        index, byte_index = self._indexes(regex, build)
        grammar = CompiledGrammar(
            regex, index, byte_index, self.vocab, mask_cache_states=self.mask_cache_states
        )
        grammar.budget_aware = self.budget_aware
        start = grammar.initial_state
        if grammar.num_allowed(start) == 0 and not grammar.is_accepting(start):
            raise GrammarError("the pattern matches no text this tokenizer can produce")
        return grammar

    def _indexes(self, regex: str, build: _Build | None) -> tuple[Index, Index]:
        """The automaton's indexes of `regex` over the vocabulary and over bytes, built in a
        worker process that is killed at the timeout (_Stopped then), or in this thread where
        no worker can start."""
        try:
            job = self.index_workers.start(regex)
        except WorkersUnavailable:
            return Index(regex, self.vocab.index_vocab), Index(regex, byte_vocabulary())
        if build is not None:
            with self._lock:
                build.job = job
                abandoned = build.abandoned
            if abandoned:
                job.lower_priority(ABANDONED_NICE)
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
                        "(long maxLength strings, the any-JSON schema {} and deep nesting are slow)"
                    )
                )

    def _put(self, key: tuple[str, str], future: Future[Grammar]) -> None:
        self._cache[key] = future
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


class _Stopped(GrammarError):
    """An automaton build stopped at the timeout (the timeout's own error, or the fallback,
    settles its future)."""


class _Build:
    """One build in flight: its key and shared future, the worker's thread id and index job
    (for their priority), whether "auto" stopped waiting for the automaton, how many attempts
    still run."""

    def __init__(
        self,
        kind: str,
        key: tuple[str, str],
        future: Future[Grammar],
        fallback: tuple[str, Any] | None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.future = future
        self.fallback = fallback
        self.timers: list[threading.Timer] = []
        self.tid: int | None = None
        self.job: IndexJob | None = None  # the automaton's build in a worker process
        self.abandoned = False
        self.running = 1  # the worker; the fallback thread of an abandoned build adds one


def _lower_priority(tid: int) -> None:
    """Nice 19 for one thread (Linux: a thread id is a PRIO_PROCESS target); never fatal."""
    # NOTE: not on this platform, or the thread is gone: nothing to slow down
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, ABANDONED_NICE)

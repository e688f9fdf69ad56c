"""Regex / JSON Schema / EBNF → compiled grammar, cached and built off the caller's thread.

`GrammarCompiler.validate` is the fast synchronous check done at submission: it picks the
backend (the outlines-core automaton, whose budget rule alone is exact; llguidance for
EBNF/Lark and for schemas the automaton refuses; xgrammar when asked for) and the source it
compiles; a JSON Schema is first rewritten into keywords the automaton and llguidance enforce
(schema_normalize: exact rewrites, formats as subset patterns; xgrammar reads the schema as
submitted). `submit` builds it on a worker thread and shares one future per (backend, source)
among all requests; the result is a `Grammar` (protocols.py: the automaton's CompiledGrammar,
llguidance's LLGrammar or xgrammar's XGGrammar) whose `new_guide(...)` is the per-request
`Guide`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, NamedTuple

import jsonschema
from outlines_core import Index

from sgl_lite.backend.constrained.automaton.cost import index_cost
from sgl_lite.backend.constrained.automaton.grammar import (
    DEFAULT_MASK_CACHE_STATES,
    CompiledGrammar,
)
from sgl_lite.backend.constrained.automaton.index_worker import (
    BuildStopped,
    IndexBuildError,
    IndexJob,
    IndexWorkers,
    WorkersUnavailable,
)
from sgl_lite.backend.constrained.compile_stats import CompileStats
from sgl_lite.backend.constrained.matchers.llguidance_backend import (
    LLGrammar,
    check_llguidance,
    ll_tokenizer,
    to_llguidance,
)
from sgl_lite.backend.constrained.matchers.xgrammar_backend import XGGrammar, to_xgrammar
from sgl_lite.backend.constrained.protocols import Grammar
from sgl_lite.backend.constrained.regex_check import (
    GrammarError,
    UnsupportedSchema,
    check_regex,
    digits_to_ascii,
)
from sgl_lite.backend.constrained.schema.schema_normalize import (
    format_notes,
    is_any_object,
    keyword_path,
    normalize,
)
from sgl_lite.backend.constrained.schema.schema_pattern_properties import merged
from sgl_lite.backend.constrained.schema.schema_regex import schema_to_regex
from sgl_lite.backend.constrained.vocab import byte_vocabulary, vocabulary_for
from sgl_lite.backend.omp_threads import use_one_omp_thread

GrammarKind = Literal["regex", "json_schema", "ebnf"]
BACKENDS = ("outlines", "llguidance", "xgrammar", "auto")
ABANDONED_NICE = 19  # an automaton build "auto" stopped waiting for runs at the lowest priority
# llguidance's refusal of patternProperties a property name can match two of
_OVERLAPPING_PATTERNS = "patternProperty regexes"
MAX_REMEMBERED = 1024  # patterns whose automaton build "auto" gave up on, remembered for good
# NOTE: by default JSON is laid out exactly as `json.dumps` writes it: ", " and ": " between items
# and nothing else (xgrammar's `any_whitespace=False`). A model cannot loop on whitespace, and
# keys and separators are forced text that jump-forward appends without sampling. A configured
# whitespace pattern replaces this with that pattern at every position JSON allows whitespace.


class GrammarCompiler:
    """Validates and compiles regexes and JSON Schemas for one tokenizer; caches the results.

    One compiler per engine. The cache is an LRU of `cache_size` compiled grammars keyed by
    (backend, normalized source), so equal patterns share one grammar whatever their kind or
    spelling. `backend` "auto" sends each request to the automaton where it expresses the whole
    constraint and its index is cheap to build (automaton/cost.py estimates that up front), and
    to llguidance otherwise (EBNF, schemas with keywords the automaton refuses, patterns whose
    index would take seconds); an automaton build that fails, or is still running at half the
    timeout, falls back to llguidance too (the build left behind runs on at nice 19 until the
    timeout, and is never started again for that pattern). Automaton indexes are built in child
    processes (automaton/index_worker.py), so no build outlives the timeout. "llguidance" and
    "xgrammar" send every request to that backend. The automaton cannot express a context-free
    grammar, so under "outlines" an `ebnf` request goes to llguidance.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        whitespace_pattern: str | None = None,
        timeout_s: float = 10.0,
        cache_size: int = 64,
        mask_cache_states: int = DEFAULT_MASK_CACHE_STATES,
        backend: str = "outlines",
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(
                f"grammar backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
            )
        if timeout_s <= 0 or cache_size < 1:
            raise ValueError(
                f"need timeout_s > 0 and cache_size >= 1, got {timeout_s}, {cache_size}"
            )
        self.tokenizer = tokenizer
        self.backend = backend
        self.budget_aware = True  # bench-only switch, see CompiledGrammar.budget_aware
        self.vocab = vocabulary_for(tokenizer)
        self.whitespace_pattern = whitespace_pattern
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.mask_cache_states = mask_cache_states
        self._cache: OrderedDict[tuple[str, str], Future[Grammar]] = OrderedDict()
        self._validated: OrderedDict[tuple[str, str], _Plan | GrammarError] = OrderedDict()
        # automaton sources "auto" no longer builds (a build failed or was abandoned)
        self._no_automaton: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CompileStats()  # every build's duration, for /metrics
        self.index_workers = IndexWorkers((self.vocab.index_vocab, byte_vocabulary()))
        weakref.finalize(self, self.index_workers.close)
        if backend == "auto":
            # NOTE: llguidance's view of the tokenizer takes seconds to build (more on a loaded
            # machine); built now, off the caller's thread, a fallback at half the timeout
            # does not pay it inside the timeout
            threading.Thread(
                target=_warm_llguidance, args=(tokenizer,), name="llguidance-warm", daemon=True
            ).start()

    # -- validation: synchronous, fast ---------------------------------------------------

    def validate(self, kind: str, pattern: str | dict) -> str:
        """Checks a pattern and returns the source that will be compiled (the regex for the
        automaton backend, the grammar text for llguidance).

        Raises GrammarError naming the problem (bad regex, bad JSON, bad or unsupported schema
        with the keyword and its path, a grammar that does not parse).
        """
        return self.plan(kind, pattern)[1]

    def regex_for(self, kind: str, pattern: str | dict) -> str:
        """The automaton's regex for a regex or JSON Schema whatever the backend (for callers
        that embed it in a larger regex, e.g. tool calls); GrammarError if it cannot be one."""
        if self.backend == "outlines":
            return self.validate(kind, pattern)
        return self._to_regex(kind, _prepared(kind, pattern))

    def plan(self, kind: str, pattern: str | dict) -> tuple[str, str]:
        """(backend, source) for a pattern; validate() with the backend that will build it."""
        found = self._plan_of(kind, pattern)
        return found.backend, found.source

    def notes(self, kind: str, pattern: str | dict) -> tuple[str, ...]:
        """What serving the pattern leaves unenforced or narrows (an unknown format ignored as
        the annotation it is...), one sentence each, for the response's `constraint_notes`;
        GrammarError as `validate`."""
        return self._plan_of(kind, pattern).notes

    def _plan_of(self, kind: str, pattern: str | dict) -> _Plan:
        try:
            key = (kind, pattern if isinstance(pattern, str) else _dumps(pattern))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"{kind} pattern cannot be serialized: {exc}") from None
        with self._lock:
            hit = self._validated.get(key)
        if hit is None:
            try:
                hit = self._plan(kind, pattern)
            except GrammarError as exc:
                hit = exc
            with self._lock:
                self._validated[key] = hit
                while len(self._validated) > 4 * self.cache_size:
                    self._validated.popitem(last=False)
        if isinstance(hit, GrammarError):
            raise type(hit)(str(hit))
        return hit

    def _plan(self, kind: str, pattern: str | dict) -> _Plan:
        notes: list[str] = []
        if self.backend == "xgrammar":
            source = self._xgrammar_source(kind, pattern)
            if kind == "json_schema":  # xgrammar ignores an unknown format, as normalize drops it
                notes = format_notes(_load_schema(pattern))
            return _Plan("xgrammar", source, tuple(notes))
        pattern = _prepared(kind, pattern, notes)

        def llguidance() -> _Plan:
            try:
                return _Plan("llguidance", self._llguidance_source(kind, pattern), tuple(notes))
            except GrammarError as exc:
                narrowed = merged(pattern) if _OVERLAPPING_PATTERNS in str(exc) else None
                if narrowed is None:
                    raise
            # NOTE: a sound restriction (schema_pattern_properties), only where it is refused
            source = self._llguidance_source(kind, narrowed[0])
            return _Plan("llguidance", source, (*notes, *narrowed[1]))

        # a grammar, or "any JSON object" (unbounded nesting), needs a real grammar backend
        if kind == "ebnf" or self.backend == "llguidance" or _any_object(kind, pattern):
            return llguidance()
        try:
            regex = self._to_regex(kind, pattern)
        except UnsupportedSchema as exc:
            if self.backend != "auto":
                raise
            try:
                return llguidance()
            except GrammarError as llg:
                raise UnsupportedSchema(f"{exc}; llguidance refuses it too: {llg}") from None
        if self.backend != "auto":
            return _Plan("outlines", regex, tuple(notes))
        with self._lock:
            given_up = regex in self._no_automaton
        if given_up or index_cost(regex, self.vocab.size).expensive:
            # NOTE: indexing such a regex takes seconds to minutes (long bounded strings,
            # Unicode classes, large schemas); llguidance builds it lazily in milliseconds.
            try:
                return llguidance()
            except GrammarError:
                pass  # the automaton may still make it within the timeout
        return _Plan("outlines", regex, tuple(notes), (kind, pattern))

    def _llguidance_source(self, kind: str, pattern: Any) -> str:
        """llguidance's grammar for a prepared pattern (see _prepared); GrammarError if refused."""
        if kind == "regex" and not isinstance(pattern, str):
            raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")
        source = to_llguidance(kind, pattern, whitespace=self.whitespace_pattern)
        try:
            check_llguidance(kind, source, self.tokenizer)
        except GrammarError as exc:
            raise _with_path(exc, pattern) if kind == "json_schema" else exc from None
        return source

    def _xgrammar_source(self, kind: str, pattern: str | dict) -> str:
        if kind == "json_schema":
            pattern = _load_schema(pattern)
        elif kind == "regex" and not isinstance(pattern, str):
            raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")
        return to_xgrammar(kind, pattern, whitespace=self.whitespace_pattern)

    def _to_regex(self, kind: str, pattern: Any) -> str:
        """The automaton's regex for a prepared pattern (see _prepared)."""
        if kind == "regex":
            if not isinstance(pattern, str):
                raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")
            check_regex(pattern, what="regex")
            return digits_to_ascii(pattern)
        if kind == "json_schema":
            regex = schema_to_regex(pattern, whitespace=self.whitespace_pattern)
            return digits_to_ascii(regex)
        raise GrammarError(f"grammar kind must be 'regex', 'json_schema' or 'ebnf', got {kind!r}")

    # -- compilation: off the caller's thread, cached ------------------------------------

    def submit(self, kind: str, pattern: str | dict) -> Future[Grammar]:
        """A future of the compiled grammar; never blocks on a build and never raises.

        Invalid patterns give an already-failed future (call `validate` to fail fast at
        submission). A build longer than `timeout_s` fails the future with GrammarError.
        Under "auto" an automaton build that fails, or runs past half of `timeout_s`, is
        replaced by llguidance's build of the same pattern; the abandoned build goes on at
        nice 19 until the timeout and, should it succeed by then, its grammar replaces the cache
        entry (the exact budget rule for later requests). An automaton build still running at
        the timeout is stopped (its worker process killed); later submissions of the pattern
        get the same failed future while it stays cached.
        """
        try:
            found = self._plan_of(kind, pattern)
        except GrammarError as exc:
            failed: Future[Grammar] = Future()
            failed.set_exception(exc)
            return failed
        key = (found.backend, found.source)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            future: Future[Grammar] = Future()
            future.set_running_or_notify_cancel()  # NOTE: shared, so no caller can cancel it
            self._put(key, future)
        build = _Build(kind, key, future, found.fallback)
        build.timers.append(threading.Timer(self.timeout_s, self._expire, args=(kind, future)))
        if found.fallback is not None:
            build.timers.append(threading.Timer(self.timeout_s / 2, self._abandon, args=(build,)))
        worker = threading.Thread(
            target=self._build, args=(build,), name="grammar-compile", daemon=True
        )
        for timer in build.timers:
            timer.daemon = True
            timer.start()
        worker.start()
        return future

    def compile(self, kind: str, pattern: str | dict) -> Grammar:
        """Blocking `submit(...).result()`: same cache, same timeout; raises GrammarError.

        The result is a CompiledGrammar (automaton), an LLGrammar (llguidance) or an XGGrammar
        (xgrammar)."""
        return self.submit(kind, pattern).result()

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


class _Plan(NamedTuple):
    """What validation decided for one pattern: the backend, the source it compiles, the notes
    for the response, and (auto, automaton) the prepared pattern llguidance builds instead if
    the automaton's build fails or is abandoned."""

    backend: str
    source: str
    notes: tuple[str, ...] = ()
    fallback: tuple[str, Any] | None = None


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


def _warm_llguidance(tokenizer: Any) -> None:
    """Builds (and caches) llguidance's tokenizer; a failure shows up at the first use."""
    with contextlib.suppress(Exception):
        ll_tokenizer(tokenizer)


def _lower_priority(tid: int) -> None:
    """Nice 19 for one thread (Linux: a thread id is a PRIO_PROCESS target); never fatal."""
    # NOTE: not on this platform, or the thread is gone: nothing to slow down
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, ABANDONED_NICE)


def _any_object(kind: str, pattern: str | dict) -> bool:
    """A json_schema for any JSON object: llguidance whatever the backend (it is exact, the
    automaton only bounded)."""
    return kind == "json_schema" and is_any_object(pattern)


# llguidance's refusals that name a keyword but not where it is: (message, keyword (None: the
# message's group 1), which of its values the refusal is about, from the message)
_Test = Callable[[Any], bool]
_LLG_UNSUPPORTED: tuple[tuple[re.Pattern[str], str | None, Callable[[str], _Test] | None], ...] = (
    (re.compile(r'Unimplemented keys: \["([^"]+)"'), None, None),
    (re.compile(r"Unknown format: (\S+)"), "format", lambda name: name.__eq__),
    (re.compile(r"oneOf constraints are not supported"), "oneOf", None),
    (
        re.compile(r"required property '([^']*)' is unsatisfiable"),
        "required",
        lambda name: lambda names: isinstance(names, list) and name in names,
    ),
    (
        re.compile(r"Resource '(.*)' is not present in a registry"),
        "$ref",
        lambda _: lambda ref: isinstance(ref, str) and not ref.startswith("#"),
    ),
)


_LLG_WHERE = re.compile(r"while processing json-schema:///#(/\S*)")


def _with_path(exc: GrammarError, schema: Any) -> GrammarError:
    """llguidance's refusal with the keyword and its path in the schema put first, as the
    automaton's refusals give them."""
    for regex, keyword, values in _LLG_UNSUPPORTED:
        match = regex.search(str(exc))
        if match is None:
            continue
        key = keyword or match[1]
        where = _LLG_WHERE.search(str(exc))  # llguidance's own pointer, when it gives one
        if where is not None:
            path: str | None = where[1] or "/"
        else:
            path = keyword_path(schema, key, None if values is None else values(match[1]))
        if path is not None:
            return type(exc)(f"json_schema keyword '{key}' at {path} is not supported: {exc}")
    return exc


def _prepared(kind: str, pattern: Any, notes: list[str] | None = None) -> Any:
    """A json_schema loaded, checked against its metaschema and rewritten into keywords
    the backends enforce (schema_normalize, which appends to `notes` what it leaves unenforced
    or narrows); any other pattern as it is. The output is still validated against the schema
    as submitted."""
    return normalize(_load_schema(pattern), notes) if kind == "json_schema" else pattern


def _dumps(schema: Any) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _load_schema(pattern: str | dict) -> dict:
    """The schema as a dict, checked against its metaschema; GrammarError naming the problem."""
    if isinstance(pattern, str):
        try:
            schema = json.loads(pattern)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"json_schema is not valid JSON: {exc}") from None
    else:
        schema = pattern
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise GrammarError(
            f"json_schema is not a valid JSON Schema at {where}: {exc.message}"
        ) from None
    return schema

"""Regex / JSON Schema → compiled automaton index, cached and built off the caller's thread.

`GrammarCompiler.validate` is the fast synchronous check done at submission; `submit` builds the
outlines-core `Index` on a worker thread and shares one future per normalized regex among all
requests. The build (automaton plus budget table, see grammar.py) happens there too; the
per-request cursor is `guide.Guide`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Literal

import jsonschema
from outlines_core import Index

from sgl_lite.backend.constrained.grammar import DEFAULT_MASK_CACHE_STATES, CompiledGrammar
from sgl_lite.backend.constrained.regex_check import (
    GrammarError,
    check_regex,
    digits_to_ascii,
    string_patterns,
)
from sgl_lite.backend.constrained.schema_regex import schema_to_regex
from sgl_lite.backend.constrained.vocab import byte_vocabulary, vocabulary_for

GrammarKind = Literal["regex", "json_schema"]
# NOTE: by default JSON is laid out exactly as `json.dumps` writes it: ", " and ": " between items
# and nothing else (xgrammar's `any_whitespace=False`). A model cannot loop on whitespace, and
# keys and separators are forced text that jump-forward appends without sampling. A configured
# whitespace pattern replaces this with that pattern at every position JSON allows whitespace.


class GrammarCompiler:
    """Validates and compiles regexes and JSON Schemas for one tokenizer; caches the results.

    One compiler per engine. The cache is an LRU of `cache_size` compiled grammars keyed by
    the normalized regex (so equal patterns share one grammar whatever their kind or spelling).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        whitespace_pattern: str | None = None,
        timeout_s: float = 10.0,
        cache_size: int = 64,
        mask_cache_states: int = DEFAULT_MASK_CACHE_STATES,
    ) -> None:
        if timeout_s <= 0 or cache_size < 1:
            raise ValueError(
                f"need timeout_s > 0 and cache_size >= 1, got {timeout_s}, {cache_size}"
            )
        self.vocab = vocabulary_for(tokenizer)
        self.whitespace_pattern = whitespace_pattern
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.mask_cache_states = mask_cache_states
        self._cache: OrderedDict[str, Future[CompiledGrammar]] = OrderedDict()
        self._validated: OrderedDict[tuple[str, str], str | GrammarError] = OrderedDict()
        self._lock = threading.Lock()

    # -- validation: synchronous, fast ---------------------------------------------------

    def validate(self, kind: str, pattern: str | dict) -> str:
        """Checks a pattern and returns the regex that will be compiled.

        Raises GrammarError naming the problem (bad regex, bad JSON, bad or unsupported schema).
        """
        try:
            key = (kind, pattern if isinstance(pattern, str) else _dumps(pattern))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"{kind} pattern cannot be serialized: {exc}") from None
        with self._lock:
            hit = self._validated.get(key)
        if hit is None:
            try:
                hit = self._to_regex(kind, pattern)
            except GrammarError as exc:
                hit = exc
            with self._lock:
                self._validated[key] = hit
                while len(self._validated) > 4 * self.cache_size:
                    self._validated.popitem(last=False)
        if isinstance(hit, GrammarError):
            raise GrammarError(str(hit))
        return hit

    def _to_regex(self, kind: str, pattern: str | dict) -> str:
        if kind == "regex":
            if not isinstance(pattern, str):
                raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")
            check_regex(pattern, what="regex")
            return digits_to_ascii(pattern)
        if kind == "json_schema":
            return digits_to_ascii(self._schema_to_regex(pattern))
        raise GrammarError(f"grammar kind must be 'regex' or 'json_schema', got {kind!r}")

    def _schema_to_regex(self, pattern: str | dict) -> str:
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
        for regex in string_patterns(schema):
            check_regex(regex, what="json_schema pattern")
        return schema_to_regex(schema, whitespace=self.whitespace_pattern)

    # -- compilation: off the caller's thread, cached ------------------------------------

    def submit(self, kind: str, pattern: str | dict) -> Future[CompiledGrammar]:
        """A future of the compiled grammar; never blocks on a build and never raises.

        Invalid patterns give an already-failed future (call `validate` to fail fast at
        submission). A build longer than `timeout_s` fails the future with GrammarError.
        NOTE: a timed-out build cannot be stopped; it keeps running on its daemon thread and
        later submissions of the same pattern get the same failed future until it ends; then
        its late result (success or failure) replaces the cache entry.
        """
        try:
            regex = self.validate(kind, pattern)
        except GrammarError as exc:
            failed: Future[CompiledGrammar] = Future()
            failed.set_exception(exc)
            return failed
        with self._lock:
            hit = self._cache.get(regex)
            if hit is not None:
                self._cache.move_to_end(regex)
                return hit
            future: Future[CompiledGrammar] = Future()
            future.set_running_or_notify_cancel()  # NOTE: shared, so no caller can cancel it
            self._put(regex, future)
        timer = threading.Timer(self.timeout_s, self._expire, args=(kind, future))
        timer.daemon = True
        worker = threading.Thread(
            target=self._build, args=(regex, future, timer), name="grammar-compile", daemon=True
        )
        timer.start()
        worker.start()
        return future

    def compile(self, kind: str, pattern: str | dict) -> CompiledGrammar:
        """Blocking `submit(...).result()`: same cache, same timeout; raises GrammarError."""
        return self.submit(kind, pattern).result()

    def _build(self, regex: str, future: Future[CompiledGrammar], timer: threading.Timer) -> None:
        try:
            outcome: CompiledGrammar | GrammarError = self._build_grammar(regex)
        except GrammarError as exc:
            outcome = exc
        except Exception as exc:
            outcome = GrammarError(f"cannot compile the pattern into an automaton: {exc}")
        timer.cancel()
        with self._lock:
            if not future.done():
                target = future
            elif self._cache.get(regex) is future:  # timed out earlier: keep the late result
                target = Future()
                target.set_running_or_notify_cancel()
                self._put(regex, target)
            else:
                return
            if isinstance(outcome, GrammarError):
                target.set_exception(outcome)
            else:
                target.set_result(outcome)

    def _build_grammar(self, regex: str) -> CompiledGrammar:
        index = Index(regex, self.vocab.index_vocab)
        byte_index = Index(regex, byte_vocabulary())
        grammar = CompiledGrammar(
            regex, index, byte_index, self.vocab, mask_cache_states=self.mask_cache_states
        )
        start = grammar.initial_state
        if grammar.num_allowed(start) == 0 and not grammar.is_accepting(start):
            raise GrammarError("the pattern matches no text this tokenizer can produce")
        return grammar

    def _expire(self, kind: str, future: Future[CompiledGrammar]) -> None:
        with self._lock:
            if not future.done():
                future.set_exception(
                    GrammarError(
                        f"{kind} compile timed out after {self.timeout_s} s; simplify the pattern "
                        "(long maxLength strings, the any-JSON schema {} and deep nesting are slow)"
                    )
                )

    def _put(self, regex: str, future: Future[CompiledGrammar]) -> None:
        self._cache[regex] = future
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


def _dumps(schema: Any) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)

"""Regex / JSON Schema / EBNF → compiled grammar, cached and built off the caller's thread.

`GrammarCompiler.validate` is the fast synchronous check done at submission: it picks the
backend (the outlines-core automaton, whose budget rule alone is exact; llguidance for
EBNF/Lark and for schemas the automaton refuses; xgrammar when asked for) and the source it
compiles; a JSON Schema is first rewritten into keywords the automaton and llguidance enforce
(schema_normalize: exact rewrites, formats as subset patterns; xgrammar reads the schema as
submitted). `submit` builds it off the caller's thread (builds.py) and shares one future per
(backend, source) among all requests; the result is a `Grammar` (protocols.py: the
automaton's CompiledGrammar, llguidance's LLGrammar or xgrammar's XGGrammar) whose
`new_guide(...)` is the per-request `Guide`.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, NamedTuple

import jsonschema

from sgl_lite.backend.constrained.automaton.cost import index_cost
from sgl_lite.backend.constrained.automaton.grammar import DEFAULT_MASK_CACHE_STATES
from sgl_lite.backend.constrained.automaton.index_worker import IndexWorkers
from sgl_lite.backend.constrained.builds import GrammarBuilds
from sgl_lite.backend.constrained.compile_stats import CompileStats
from sgl_lite.backend.constrained.matchers.llguidance_backend import (
    check_llguidance,
    ll_tokenizer,
    to_llguidance,
)
from sgl_lite.backend.constrained.matchers.xgrammar_backend import to_xgrammar
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
from sgl_lite.backend.constrained.vocab import vocabulary_for

GrammarKind = Literal["regex", "json_schema", "ebnf"]
BACKENDS = ("outlines", "llguidance", "xgrammar", "auto")
# llguidance's refusal of patternProperties a property name can match two of
_OVERLAPPING_PATTERNS = "patternProperty regexes"
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
        self.vocab = vocabulary_for(tokenizer)
        self.whitespace_pattern = whitespace_pattern
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._validated: OrderedDict[tuple[str, str], _Plan | GrammarError] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = GrammarBuilds(
            tokenizer,
            self.vocab,
            timeout_s=timeout_s,
            cache_size=cache_size,
            mask_cache_states=mask_cache_states,
            llguidance_source=self._llguidance_source,
        )
        if backend == "auto":
            # NOTE: llguidance's view of the tokenizer takes seconds to build (more on a loaded
            # machine); built now, off the caller's thread, a fallback at half the timeout
            # does not pay it inside the timeout
            threading.Thread(
                target=_warm_llguidance, args=(tokenizer,), name="llguidance-warm", daemon=True
            ).start()

    @property
    def stats(self) -> CompileStats:
        """Every build's duration and outcome, for /metrics."""
        return self.builds.stats

    @property
    def index_workers(self) -> IndexWorkers:
        """The processes that build the automaton's indexes (automaton/index_worker.py)."""
        return self.builds.index_workers

    @property
    def budget_aware(self) -> bool:
        """Bench-only switch, see CompiledGrammar.budget_aware: False builds automata
        without the budget rule."""
        return self.builds.budget_aware

    @budget_aware.setter
    def budget_aware(self, value: bool) -> None:
        self.builds.budget_aware = value

    def close(self) -> None:
        """Lets the idle index workers go (builds in flight end on their own)."""
        self.builds.close()

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
        if self.builds.gave_up_on(regex) or index_cost(regex, self.vocab.size).expensive:
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
        submission). A build longer than `timeout_s` fails the future with GrammarError;
        how builds run, share, time out and fall back: builds.py.
        """
        try:
            found = self._plan_of(kind, pattern)
        except GrammarError as exc:
            failed: Future[Grammar] = Future()
            failed.set_exception(exc)
            return failed
        return self.builds.submit(kind, found.backend, found.source, found.fallback)

    def compile(self, kind: str, pattern: str | dict) -> Grammar:
        """Blocking `submit(...).result()`: same cache, same timeout; raises GrammarError.

        The result is a CompiledGrammar (automaton), an LLGrammar (llguidance) or an XGGrammar
        (xgrammar)."""
        return self.submit(kind, pattern).result()


class _Plan(NamedTuple):
    """What validation decided for one pattern: the backend, the source it compiles, the notes
    for the response, and (auto, automaton) the prepared pattern llguidance builds instead if
    the automaton's build fails or is abandoned."""

    backend: str
    source: str
    notes: tuple[str, ...] = ()
    fallback: tuple[str, Any] | None = None


def _warm_llguidance(tokenizer: Any) -> None:
    """Builds (and caches) llguidance's tokenizer; a failure shows up at the first use."""
    with contextlib.suppress(Exception):
        ll_tokenizer(tokenizer)


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

"""Regex / JSON Schema / EBNF → compiled grammar, routed by a fixed table, cached, built off
the caller's thread.

`GrammarCompiler.validate` is the fast synchronous check done at submission: it picks the
backend from `ROUTES` (the engine's `grammar_backend` and the constraint's kind) and two named
rules, and the source it compiles; a JSON Schema is first rewritten into keywords the automaton
and llguidance enforce (schema_normalize: exact rewrites, formats as subset patterns; xgrammar
reads the schema as submitted). `submit` builds it off the caller's thread (builds.py) and
shares one future per (backend, source) among all requests; the result is a `Grammar`
(protocols.py: the automaton's CompiledGrammar, llguidance's LLGrammar or xgrammar's
XGGrammar) whose `new_guide(...)` is the per-request `Guide`.
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
# The routing table: grammar_backend -> kind -> the backend that builds it. "outlines" is the
# automaton; it cannot express a context-free grammar, so `ebnf` goes to llguidance under it.
# `auto` gives regexes (and the frontend's dtype regexes) to the automaton, whose exact budget
# table is its strongest guarantee on short patterns, and schemas and grammars to llguidance
# (lazy, milliseconds to build, real recursion; the closer keeps it within max_new_tokens).
ROUTES: dict[str, dict[str, str]] = {
    "auto": {"regex": "outlines", "json_schema": "llguidance", "ebnf": "llguidance"},
    "outlines": {"regex": "outlines", "json_schema": "outlines", "ebnf": "llguidance"},
    "llguidance": {"regex": "llguidance", "json_schema": "llguidance", "ebnf": "llguidance"},
    "xgrammar": {"regex": "xgrammar", "json_schema": "xgrammar", "ebnf": "xgrammar"},
}
# Named rules on top of the table (each has its test in tests/tokenizer/test_constrained_routing):
# ANY_OBJECT: the any-JSON-object schema goes to llguidance under "outlines" too (the automaton
# writes only a bounded subset of it; llguidance's recursion is exact).
# AUTOMATON_WHERE_LLGUIDANCE_REFUSES: under "auto", a schema llguidance refuses goes to the
# automaton if it serves it exactly. Measured on the JSON Schema Test Suite and the
# JSONSchemaBench sample, this class is numbers past 64 bits (bignum.json) and a `$schema`
# metaschema llguidance would fetch (vocabulary.json, format-assertion.json): 8 suite schemas,
# no JSONSchemaBench schema.
# NOTE: by default JSON is laid out exactly as `json.dumps` writes it: ", " and ": " between items
# and nothing else (xgrammar's `any_whitespace=False`). A model cannot loop on whitespace, and
# keys and separators are forced text that jump-forward appends without sampling. A configured
# whitespace pattern replaces this with that pattern at every position JSON allows whitespace.


class GrammarCompiler:
    """Validates and compiles regexes and JSON Schemas for one tokenizer; caches the results.

    One compiler per engine. The cache is an LRU of `cache_size` compiled grammars keyed by
    (backend, normalized source), so equal patterns share one grammar whatever their kind or
    spelling. `backend` picks a row of `ROUTES`; under "auto" a regex goes to the automaton and
    a schema or grammar to llguidance, with the named rules beside the table. A build that runs
    past `timeout_s` fails with GrammarError (an automaton index build is stopped: builds.py).
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
        )
        # NOTE: what the first schema request would otherwise wait for is started now, off
        # the caller's thread: jsonschema's import (~1 s: its format checkers build a parser)
        # and, under `auto`, which sends every schema to llguidance, llguidance's view of the
        # tokenizer (seconds, more on a loaded machine)
        threading.Thread(
            target=_warm, args=(tokenizer, backend == "auto"), name="grammar-warm", daemon=True
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
        if kind not in ("regex", "json_schema", "ebnf"):
            raise GrammarError(
                f"grammar kind must be 'regex', 'json_schema' or 'ebnf', got {kind!r}"
            )
        route = ROUTES[self.backend][kind]
        if route == "xgrammar":
            if kind == "json_schema":
                pattern = _load_schema(pattern)  # parsed once: its grammar and its notes
            source = self._xgrammar_source(kind, pattern)
            unknown = format_notes(pattern) if kind == "json_schema" else []
            return _Plan("xgrammar", source, tuple(unknown))  # it ignores an unknown format too
        found: list[str] = []
        pattern = _prepared(kind, pattern, found)
        notes = tuple(found)
        if route == "outlines" and _any_object(kind, pattern):  # ANY_OBJECT
            route = "llguidance"
        if route == "outlines":
            return _Plan("outlines", self._to_regex(kind, pattern), notes)
        try:
            return self._llguidance_plan(kind, pattern, notes)
        except GrammarError as refused:
            if self.backend != "auto" or kind != "json_schema":
                raise
            try:  # AUTOMATON_WHERE_LLGUIDANCE_REFUSES
                return _Plan("outlines", self._to_regex(kind, pattern), notes)
            except GrammarError as exc:
                raise type(refused)(f"{refused}; the automaton refuses it too: {exc}") from None

    def _llguidance_plan(self, kind: str, pattern: Any, notes: tuple[str, ...]) -> _Plan:
        """llguidance's plan for a prepared pattern; GrammarError if refused. A schema refused
        that has objects with two or more `patternProperties` is tried once more with them
        merged (schema_pattern_properties: a sound restriction, said in the notes), since
        llguidance compiles only patterns no name can match two of."""
        try:
            return _Plan("llguidance", self._llguidance_source(kind, pattern), notes)
        except GrammarError as refused:
            narrowed = merged(pattern) if kind == "json_schema" else None
            if narrowed is None:
                raise
            try:
                source = self._llguidance_source(kind, narrowed[0])
            except GrammarError:
                raise refused from None
        return _Plan("llguidance", source, (*notes, *narrowed[1]))

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
        """xgrammar's source for a pattern (a json_schema already loaded and checked)."""
        if kind == "regex" and not isinstance(pattern, str):
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
        how builds run, share and time out: builds.py.
        """
        try:
            found = self._plan_of(kind, pattern)
        except GrammarError as exc:
            failed: Future[Grammar] = Future()
            failed.set_exception(exc)
            return failed
        return self.builds.submit(kind, found.backend, found.source)

    def compile(self, kind: str, pattern: str | dict) -> Grammar:
        """Blocking `submit(...).result()`: same cache, same timeout; raises GrammarError.

        The result is a CompiledGrammar (automaton), an LLGrammar (llguidance) or an XGGrammar
        (xgrammar)."""
        return self.submit(kind, pattern).result()


class _Plan(NamedTuple):
    """What validation decided for one pattern: the backend, the source it compiles, and the
    notes for the response."""

    backend: str
    source: str
    notes: tuple[str, ...] = ()


def _warm(tokenizer: Any, llguidance: bool) -> None:
    """Imports jsonschema and, if asked, builds (and caches) llguidance's tokenizer; a failure
    shows up at the first use."""
    with contextlib.suppress(Exception):
        import jsonschema  # noqa: F401

        if llguidance:
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
    import jsonschema  # NOTE: at first use (~1 s); GrammarCompiler warms it

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise GrammarError(
            f"json_schema is not a valid JSON Schema at {where}: {exc.message}"
        ) from None
    return schema

"""The llguidance backend: context-free grammars (SGLang's `ebnf`, Lark) and JSON Schema with
real recursion, behind the same Guide protocol the engine uses for the automaton backend.

`LLGrammar` is one validated grammar for one tokenizer (shared, with a prototype matcher built
off the loop); `LLGuide` is a per-request deep copy of that matcher. What llguidance does not
give is a distance table: the budget rests on closer.py's closer, which walks deep copies of
the matcher (`_LLCopy`); its length from the start is `LLGrammar.min_tokens`. Forced tokens
come from llguidance's own fast-forward, appended without retokenizing. Nothing here knows
about the engine.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from sgl_lite.backend.constrained.matchers.closer import ClosingMatcher
from sgl_lite.backend.constrained.matchers.grammar_guide import BackendGuide, ClosableGrammar
from sgl_lite.backend.constrained.matchers.grammar_mask import text_token_mask, unpack_bitmask
from sgl_lite.backend.constrained.protocols import Constraint
from sgl_lite.backend.constrained.regex_check import GrammarError
from sgl_lite.backend.constrained.schema.formats import STRING_FORMATS
from sgl_lite.backend.constrained.schema.keywords import schema_keywords, schema_nodes
from sgl_lite.backend.constrained.schema.string_pattern import ecma_spaces
from sgl_lite.backend.constrained.vocab import KeyedCache, vocabulary_for

_JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
_TOKENIZERS = KeyedCache()


def ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a HF fast tokenizer, built once per tokenizer content (~2 s for
    SmolLM2) and shared by every engine of the process that loads the same tokenizer."""
    import llguidance.hf

    return _TOKENIZERS.get_or_build(tokenizer, llguidance.hf.from_tokenizer)


def to_llguidance(kind: str, pattern: Any, *, whitespace: str | None = None) -> str:
    """The llguidance grammar text for a regex, JSON Schema or EBNF/Lark grammar (unchecked)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if kind == "regex":
        return LLMatcher.grammar_from_regex(pattern)
    if kind == "json_schema":
        options: Any = dict(_JSON_OPTIONS)  # llguidance types it as a TypedDict
        if whitespace is not None:
            options = {"whitespace_flexible": True, "whitespace_pattern": whitespace}
        schema = json.loads(pattern) if isinstance(pattern, str) else pattern
        try:
            return LLMatcher.grammar_from_json_schema(closed_objects(schema), defaults=options)
        except (ValueError, TypeError, OverflowError) as exc:
            # NOTE: an integer past 64 bits (a bound of bignum.json in the JSON Schema Test
            # Suite): refused, where the text form would round it to a float, a wider bound
            raise GrammarError(
                f"json_schema is not supported by the llguidance backend: {exc}"
            ) from None
    if kind == "ebnf":
        if not isinstance(pattern, str):
            raise GrammarError(f"ebnf must be a string, got {type(pattern).__name__}")
        try:
            return LLMatcher.grammar_from_lark(any_to_lark(pattern))
        except Exception as exc:
            raise GrammarError(f"ebnf grammar does not parse: {exc}") from None
    raise GrammarError(f"grammar kind must be 'regex', 'json_schema' or 'ebnf', got {kind!r}")


# keywords under which a narrower sub-schema can admit more (a narrower `not` or `if`; a oneOf
# branch that no longer matches can leave one match where there were two; fewer matches under
# `maxContains`): a schema using one is not narrowed at all
_NON_MONOTONE = frozenset(
    ("oneOf", "not", "if", "maxContains", "unevaluatedProperties", "unevaluatedItems")
)
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# llguidance's own date/time formats admit a leap second at any minute and year 0000, which the
# final check refuses, and its hostname any `xn--` label, valid Punycode or not, which the final
# check passes (the JSON Schema Test Suite's hostname.json): written as the automaton's patterns
# instead (a subset, formats.py)
_SUBSET_FORMATS = ("date", "time", "date-time", "hostname")


def closed_objects(schema: Any) -> Any:
    """The schema llguidance compiles: `additionalProperties: false` wherever properties are
    listed and nothing else is said (the subset the automaton writes, so a model cannot run on
    with invented keys; not where the schema uses allOf, whose one part closed would reject
    the properties of another), and the date/time formats as the automaton's patterns. Left as
    is when the schema uses a keyword of _NON_MONOTONE. An object that lists properties beside
    anyOf branches is closed in its branches instead, each over its own and the object's names
    (closing both would leave only the names they share: schema_normalize's discriminated
    oneOf, whose branches name `shape` beside the object's dimensions, was unsatisfiable)."""
    used = schema_keywords(schema)
    if used & _NON_MONOTONE:
        return schema
    return _close(schema, close="allOf" not in used and not _conjoined_refs(schema))


# What may stand beside a `$ref` without joining its schema: annotations and definitions.
_REF_ANNOTATIONS = frozenset(
    ("$ref", "$defs", "definitions", "$id", "$anchor", "$schema", "$comment", "title",
     "description", "default", "examples", "deprecated", "readOnly", "writeOnly")
)  # fmt: skip


def _conjoined_refs(schema: Any) -> bool:
    """Whether some `$ref` stands beside keywords that constrain: draft 2020-12 applies both,
    as allOf does, so closing either part would reject the other's properties (found by the
    exactness property test: a closed `$ref` target beside `properties: {}`, closed in turn)."""
    return any(
        "$ref" in node and not node.keys() <= _REF_ANNOTATIONS for node in schema_nodes(schema)
    )


def _close(node: Any, names: tuple[str, ...] = (), *, close: bool) -> Any:
    """closed_objects below `node`; `names`: the properties an enclosing object lists beside
    the anyOf that `node` is a branch of (vacuous `true` entries, then closed over)."""
    if isinstance(node, list):
        return [_close(v, close=close) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _close(v, close=close) if k not in ("enum", "const", "default", "examples") else v
        for k, v in node.items()
    }
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _SUBSET_FORMATS and "pattern" not in node:
        del out["format"]
        out["pattern"] = f"^{STRING_FORMATS[fmt]}$"
    pattern = node.get("pattern")
    if isinstance(pattern, str) and ("\\s" in pattern or "\\S" in pattern):
        out["pattern"] = ecma_spaces(pattern)  # Rust's `\s` and `\S` are neither ECMA's nor re's
    props = node.get("properties", {})
    if not close or not isinstance(props, dict):
        return out
    listed = (*names, *props)
    branches = node.get("anyOf")
    if isinstance(branches, list):
        if listed and all(isinstance(b, dict) and "$ref" not in b for b in branches):
            out["anyOf"] = [_close(b, listed, close=close) for b in branches]
    elif ("properties" in node or names) and not any(k in node for k in _OPEN_KEYS):
        out["properties"] = {**dict.fromkeys(names, True), **out.get("properties", {})}
        out["additionalProperties"] = False
    return out


def check_llguidance(kind: str, grammar: str, tokenizer: Any) -> None:
    """Raises GrammarError with llguidance's own message if it refuses the grammar."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer(tokenizer))
    if is_error:
        raise GrammarError(f"{kind} is not supported by the llguidance backend: {messages[0]}")


class LLGrammar(ClosableGrammar):
    """A validated llguidance grammar over one tokenizer; `new_guide` makes request cursors."""

    backend = "llguidance"

    def __init__(self, grammar: str, tokenizer: Any, vocab_size: int, eos_token_id: int) -> None:
        from llguidance import LLMatcher

        self.grammar = grammar
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        vocab = vocabulary_for(tokenizer)
        self.text_mask = text_token_mask(vocab)
        self.text_words = packed_text_words(self.text_mask, eos_token_id)
        self._proto = LLMatcher(ll_tokenizer(tokenizer), grammar)
        if self._proto.is_error():
            raise GrammarError(f"llguidance cannot build the grammar: {self._proto.get_error()}")
        self._init_closer(vocab, lambda: _LLCopy(self._proto, self))

    def new_guide(
        self, *, max_new_tokens: int | None = None, constraint: Constraint | None = None
    ) -> LLGuide:
        """A fresh cursor for one request (a copy of the prototype matcher)."""
        return LLGuide(self, self._proto.deep_copy(), max_new_tokens, constraint)


class LLGuide(BackendGuide):
    """Where one request stands in an llguidance grammar (the Guide protocol)."""

    def __init__(
        self,
        grammar: LLGrammar,
        matcher: Any,
        max_new_tokens: int | None,
        constraint: Constraint | None,
    ) -> None:
        super().__init__(grammar, max_new_tokens, constraint)
        self.grammar = grammar
        self._matcher = matcher

    def _fill_mask(self) -> torch.Tensor:
        from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

        bits = allocate_token_bitmask(1, self.grammar.vocab_size)  # (1, ceil(V/32)) int32
        fill_next_token_bitmask(self._matcher, bits, 0)
        return unpack_bitmask(bits[0], self.grammar.vocab_size) & self.grammar.text_mask

    def _consume(self, token_id: int) -> str | None:
        return None if self._matcher.consume_token(token_id) else self._matcher.get_error()

    def _rollback(self, n: int) -> None:
        self._matcher.rollback(n)

    def is_accepting(self) -> bool:
        """Whether the output so far is complete (eos allowed)."""
        return bool(self._matcher.is_accepting())

    def is_finished(self) -> bool:
        """Whether nothing but eos can follow (llguidance's own stop, or the mask says so)."""
        return bool(self._matcher.is_stopped()) or super().is_finished()

    def _forced(self) -> list[int]:
        return list(self._matcher.compute_ff_tokens())

    def _closing_copy(self) -> ClosingMatcher:
        return _LLCopy(self._matcher, self.grammar)

    def _completes(self, tokens: list[int]) -> bool:
        return ll_completes(self._matcher, self.grammar, tokens)


class _LLCopy:
    """A deep copy of an llguidance matcher for the closer (closer.ClosingMatcher)."""

    def __init__(self, matcher: Any, grammar: LLGrammar) -> None:
        self._m = matcher.deep_copy()
        self._grammar = grammar

    def accepting(self) -> bool:
        """Whether the text so far is complete."""
        return bool(self._m.is_accepting())

    def forced(self) -> list[int]:
        """llguidance's fast-forward tokens from here."""
        return list(self._m.compute_ff_tokens())

    def forced_bytes(self) -> bytes:
        """The bytes llguidance forces from here."""
        return bytes(self._m.compute_ff_bytes())

    def try_consume(self, token_id: int) -> bool:
        """Consumes `token_id` if allowed (a refused token leaves the state as it was)."""
        # NOTE: validate, then consume: try_consume_tokens costs more deep into an output
        m = self._m
        return self._grammar.is_text[token_id] and (
            m.validate_tokens([token_id]) == 1 and bool(m.consume_token(token_id))
        )

    def lowest_allowed(self) -> int | None:
        """The lowest-id allowed text token (eos excluded), from llguidance's bitmask."""
        # NOTE: on the packed words, not closer.lowest_allowed's unpacked (V,) bool: that
        # path's half-dozen tensor ops per call were most of a closer walk's time
        return first_allowed(self._m.compute_bitmask(), self._grammar.text_words)

    def allows(self, tokens: list[int]) -> int:
        """How many of `tokens` llguidance would take from here (the state stays)."""
        return int(self._m.validate_tokens(tokens))

    def completes(self, tokens: list[int]) -> bool:
        """Whether llguidance takes `tokens` and then eos (allowed only where complete)."""
        return ll_completes(self._m, self._grammar, tokens)


def packed_text_words(text_mask: torch.Tensor, eos_token_id: int) -> np.ndarray:
    """(ceil(V/32),) uint32: `text_mask` packed as the backends pack their bitmasks (bit j of
    word w for token 32·w + j), eos cleared: what closer.lowest_allowed may return."""
    allowed = text_mask.numpy().copy()
    allowed[eos_token_id] = False
    bits = np.zeros(-(-allowed.shape[0] // 32) * 32, dtype=np.uint64)
    bits[: allowed.shape[0]] = allowed
    weights = np.left_shift(np.uint64(1), np.arange(32, dtype=np.uint64))
    return (bits.reshape(-1, 32) * weights).sum(axis=1).astype(np.uint32)


def first_allowed(bitmask: bytes, text_words: np.ndarray) -> int | None:
    """The lowest token id set in both a backend's bitmask (native uint32 words) and
    `text_words` (packed_text_words), None if none: closer.lowest_allowed on packed words."""
    words = np.frombuffer(bitmask, dtype=np.uint32)
    n = min(words.shape[0], text_words.shape[0])  # ids past either vocabulary are never allowed
    both = words[:n] & text_words[:n]
    hits = np.flatnonzero(both)
    if not hits.size:
        return None
    w = int(hits[0])
    word = int(both[w])
    return 32 * w + (word & -word).bit_length() - 1


def ll_completes(matcher: Any, grammar: LLGrammar, tokens: list[int]) -> bool:
    """Whether `matcher` takes the text `tokens` and then eos (allowed only where the text is
    complete); validate_tokens only reads the matcher, so no copy is needed."""
    if not all(grammar.is_text[t] for t in tokens):
        return False
    return matcher.validate_tokens([*tokens, grammar.eos_token_id]) == len(tokens) + 1

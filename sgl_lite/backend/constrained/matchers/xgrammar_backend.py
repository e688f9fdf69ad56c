"""The xgrammar backend: SGLang's default grammar engine, behind the same Guide protocol.

`to_xgrammar` checks a regex, JSON Schema or EBNF grammar at submission (xgrammar's parser, no
tokenizer, milliseconds) and returns its EBNF text, the cache key and what `XGGrammar` compiles
off the loop; `XGGuide` is one request's GrammarMatcher. What xgrammar does not give: a
distance table (the budget rests on closer.py's closer, walking forks of the matcher,
`_XGCopy`) and exactness on every keyword: it reads `oneOf` as `anyOf` and drops a few
(`uniqueItems`, `not`, parts of `allOf`), which the final JSON Schema validation catches and
reports. Nothing here knows about the engine.
"""

from __future__ import annotations

import json
import threading
import warnings
from typing import Any

import torch

from sgl_lite.backend.constrained.matchers.closer import ClosingMatcher, lowest_allowed
from sgl_lite.backend.constrained.matchers.grammar_guide import BackendGuide, ClosableGrammar
from sgl_lite.backend.constrained.matchers.grammar_mask import text_token_mask, unpack_bitmask
from sgl_lite.backend.constrained.protocols import Constraint
from sgl_lite.backend.constrained.regex_check import GrammarError
from sgl_lite.backend.constrained.schema.formats import STRING_FORMATS
from sgl_lite.backend.constrained.schema.schema_merge import TYPE_HINTS
from sgl_lite.backend.constrained.schema.schema_normalize import (
    ASCII_FORMS,
    COUNTS,
    EXTRA_FORMATS,
)
from sgl_lite.backend.constrained.vocab import TokenVocabulary

_COMPILERS: dict[int, tuple[Any, Any]] = {}
_LOCK = threading.Lock()
COMPILE_THREADS = 2  # xgrammar's default is 8; the engine shares a few cores with the model


def xg_compiler(tokenizer: Any, vocab: TokenVocabulary) -> Any:
    """xgrammar's GrammarCompiler for a HF tokenizer (with its own compile cache), built once."""
    import xgrammar as xgr

    with _LOCK:
        hit = _COMPILERS.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab.size, stop_token_ids=[vocab.eos_token_id]
    )
    built = xgr.GrammarCompiler(info, max_threads=COMPILE_THREADS)
    with _LOCK:
        _COMPILERS[id(tokenizer)] = (tokenizer, built)
    return built


def to_xgrammar(kind: str, pattern: Any, *, whitespace: str | None = None) -> str:
    """The xgrammar EBNF text for a regex, JSON Schema or EBNF grammar; GrammarError naming
    the field when xgrammar's parser refuses it.

    JSON is laid out as `json.dumps` writes it (", " and ": ", no other whitespace) unless a
    whitespace pattern is configured; xgrammar cannot take a pattern, so that means its own
    flexible whitespace. `strict_mode` closes objects, as the automaton does.
    """
    import xgrammar as xgr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its approximations are caught by validation
            if kind == "regex":
                grammar = xgr.Grammar.from_regex(pattern)
            elif kind == "json_schema":
                schema = json.loads(pattern) if isinstance(pattern, str) else pattern
                refuse_remote_refs(schema)
                text = json.dumps(tightened(schema))
                flexible = whitespace is not None
                grammar = xgr.Grammar.from_json_schema(
                    text,
                    any_whitespace=flexible,
                    separators=None if flexible else (", ", ": "),
                    strict_mode=True,
                )
            elif kind == "ebnf":
                if not isinstance(pattern, str):
                    raise GrammarError(f"ebnf must be a string, got {type(pattern).__name__}")
                grammar = xgr.Grammar.from_ebnf(pattern)
            else:
                raise GrammarError(
                    f"grammar kind must be 'regex', 'json_schema' or 'ebnf', got {kind!r}"
                )
    except GrammarError:
        raise
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError with the position
        what = "grammar does not parse" if kind == "ebnf" else "is not supported by xgrammar"
        raise GrammarError(f"{kind} {what}: {_short(exc)}") from None
    return str(grammar)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


# what an untyped node's keywords say of its type (the automaton's TYPE_HINTS and the keywords
# it refuses), and the keywords beside which a node is left untyped
_TYPE_HINTS = {
    **TYPE_HINTS,
    **dict.fromkeys(("multipleOf",), "number"),
    **dict.fromkeys(("uniqueItems", "contains", "minContains", "maxContains"), "array"),
    **dict.fromkeys(
        ("patternProperties", "propertyNames", "dependencies", "dependentRequired"), "object"
    ),
    **dict.fromkeys(("dependentSchemas", "unevaluatedProperties"), "object"),
    "unevaluatedItems": "array",
}
_UNTYPED = ("$ref", "anyOf", "oneOf", "allOf", "not", "if", "const", "enum")
# keywords whose value maps names to schemas (a property may be called `items` or `format`)
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def refuse_remote_refs(schema: Any, path: str = "") -> None:
    """GrammarError naming the first `$ref` that is not local (`#...`): xgrammar would read it
    as any value, and the final validation may not fetch it (nothing is downloaded)."""
    if isinstance(schema, list):
        for i, v in enumerate(schema):
            refuse_remote_refs(v, f"{path}/{i}")
    elif isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise GrammarError(
                f"json_schema keyword '$ref' at {path or '/'} is not supported by xgrammar: "
                f"{ref!r} is not a local reference (#...)"
            )
        for k, v in schema.items():
            if k not in ("enum", "const", "default", "examples"):
                refuse_remote_refs(v, f"{path}/{k}")


def tightened(schema: Any) -> Any:
    """The schema with what xgrammar reads loosely made exact: a `format` the automaton knows
    (or its ASCII form: `idn-hostname` as `hostname`...) becomes its `pattern` (xgrammar's ipv4
    admits leading zeros, which `jsonschema` refuses; its idn-hostname a trailing dot, its regex
    Python's syntax, which `jsonschema` passes), an untyped node whose keywords apply to one
    type is given that type (xgrammar reads an untyped node as any value), a count written as
    an integral float (`minLength: 2.0`) is that integer, and an `enum` beside a `type` keeps
    only the values of that type."""
    if isinstance(schema, list):
        return [tightened(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: v
        if k in ("enum", "const", "default", "examples")
        else {name: tightened(sub) for name, sub in v.items()}
        if k in _MAPS and isinstance(v, dict)
        else tightened(v)
        for k, v in schema.items()
    }
    fmt = schema.get("format")
    fmt = ASCII_FORMS.get(fmt, fmt) if isinstance(fmt, str) else fmt
    known = {**STRING_FORMATS, **EXTRA_FORMATS}
    if isinstance(fmt, str) and fmt in known and "pattern" not in schema:
        out["pattern"] = f"^{known[fmt]}$"
        del out["format"]
    for key in COUNTS:  # xgrammar refuses `minLength: 2.0`
        if isinstance(schema.get(key), float) and schema[key].is_integer():
            out[key] = int(schema[key])
    hinted = sorted({_TYPE_HINTS[k] for k in schema if k in _TYPE_HINTS})
    if "type" not in schema and hinted and not any(k in schema for k in _UNTYPED):
        # NOTE: xgrammar reads an untyped node as any value, whatever else it says
        out["type"] = hinted[0] if len(hinted) == 1 else hinted
    types = out.get("type")
    if isinstance(schema.get("enum"), list) and isinstance(types, (str, list)):
        names = [types] if isinstance(types, str) else types
        kinds = tuple(t for n in names if isinstance(n, str) for t in _JSON_TYPES.get(n, ()))

        def fits(v: Any) -> bool:
            if isinstance(v, bool):  # a bool is an int to Python, never to JSON Schema
                return "boolean" in names
            if isinstance(v, float) and "integer" in names and v.is_integer():
                return True
            return isinstance(v, kinds)

        out["enum"] = [v for v in schema["enum"] if fits(v)]
    return out


def _short(exc: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    msg = str(exc).strip()
    return msg.split(": ", 1)[1] if msg.startswith("[") and ": " in msg else msg


class XGGrammar(ClosableGrammar):
    """A compiled xgrammar grammar over one tokenizer; `new_guide` makes request cursors."""

    backend = "xgrammar"

    def __init__(self, source: str, tokenizer: Any, vocab: TokenVocabulary) -> None:
        import xgrammar as xgr

        self.source = source
        self.vocab_size = vocab.size
        self.eos_token_id = vocab.eos_token_id
        self.text_mask = text_token_mask(vocab)
        try:
            self.compiled = xg_compiler(tokenizer, vocab).compile_grammar(source)
        except Exception as exc:
            raise GrammarError(f"xgrammar cannot compile the grammar: {_short(exc)}") from None
        start = xgr.GrammarMatcher(self.compiled, max_rollback_tokens=-1)
        self._init_closer(vocab, lambda: _XGCopy(start, self))

    def new_guide(
        self, *, max_new_tokens: int | None = None, constraint: Constraint | None = None
    ) -> XGGuide:
        """A fresh cursor for one request (a new matcher over the shared compiled grammar)."""
        return XGGuide(self, max_new_tokens, constraint)


class XGGuide(BackendGuide):
    """Where one request stands in an xgrammar grammar (the Guide protocol)."""

    def __init__(
        self, grammar: XGGrammar, max_new_tokens: int | None, constraint: Constraint | None
    ) -> None:
        import xgrammar as xgr

        super().__init__(grammar, max_new_tokens, constraint)
        self.grammar = grammar
        # NOTE: unbounded rollback: jump-forward and the engine may undo any number of tokens
        self._matcher = xgr.GrammarMatcher(grammar.compiled, max_rollback_tokens=-1)
        self._bits = xgr.allocate_token_bitmask(1, grammar.vocab_size)  # (1, ceil(V/32)) int32

    def _fill_mask(self) -> torch.Tensor:
        self._matcher.fill_next_token_bitmask(self._bits, 0)
        return unpack_bitmask(self._bits[0], self.grammar.vocab_size) & self.grammar.text_mask

    def _consume(self, token_id: int) -> str | None:
        ok = self._matcher.accept_token(token_id)
        return None if ok else "xgrammar rejects it in this state"

    def _rollback(self, n: int) -> None:
        self._matcher.rollback(n)

    def is_accepting(self) -> bool:
        """Whether the output so far is a complete sentence of the grammar."""
        return bool(self._matcher.is_completed())

    def _forced(self) -> list[int]:
        return text_prefix(self._matcher.find_jump_forward_tokens(), self.grammar)

    def _closing_copy(self) -> ClosingMatcher:
        return _XGCopy(self._matcher.fork(), self.grammar)

    def _completes(self, tokens: list[int]) -> bool:
        # NOTE: on the live matcher (accepted, then rolled back), from the thread that advances
        # it: a fork costs more than the check
        return _XGCopy(self._matcher, self.grammar).completes(tokens)


def text_prefix(ids: list[int], grammar: XGGrammar) -> list[int]:
    """xgrammar's jump-forward tokens (its greedy tokenization of the forced text) up to the
    first that is not text, so a special token never enters the output this way either."""
    out: list[int] = []
    for token_id in ids:
        if token_id == grammar.eos_token_id or not bool(grammar.text_mask[token_id]):
            break
        out.append(token_id)
    return out


class _XGCopy:
    """A fork of an xgrammar matcher for the closer (closer.ClosingMatcher)."""

    def __init__(self, matcher: Any, grammar: XGGrammar) -> None:
        self._m = matcher
        self._grammar = grammar

    def accepting(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar."""
        return bool(self._m.is_completed())

    def forced(self) -> list[int]:
        """xgrammar's jump-forward tokens from here (text tokens only)."""
        return text_prefix(self._m.find_jump_forward_tokens(), self._grammar)

    def forced_bytes(self) -> bytes:
        """The text xgrammar forces from here, as bytes."""
        return self._m.find_jump_forward_string().encode("utf-8")

    def try_consume(self, token_id: int) -> bool:
        """Consumes `token_id` if allowed (a refused token leaves the state as it was)."""
        return self._grammar.is_text[token_id] and bool(self._m.accept_token(token_id))

    def lowest_allowed(self) -> int | None:
        """The lowest-id allowed text token, from xgrammar's bitmask."""
        import xgrammar as xgr

        bits = xgr.allocate_token_bitmask(1, self._grammar.vocab_size)
        self._m.fill_next_token_bitmask(bits, 0)
        return lowest_allowed(bits[0], self._grammar.text_mask, self._grammar.eos_token_id)

    def allows(self, tokens: list[int]) -> int:
        """How many of `tokens` xgrammar would take from here (accepted, then rolled back)."""
        n = 0
        for token_id in tokens:
            if not self.try_consume(token_id):
                break
            n += 1
        if n:
            self._m.rollback(n)
        return n

    def completes(self, tokens: list[int]) -> bool:
        """Whether xgrammar takes `tokens` and is then complete (accepted, rolled back)."""
        n = 0
        for token_id in tokens:
            if not self.try_consume(token_id):
                break
            n += 1
        done = n == len(tokens) and bool(self._m.is_completed())
        if n:
            self._m.rollback(n)
        return done

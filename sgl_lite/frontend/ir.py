"""The frontend's intermediate representation: what a program adds to its state.

Every node is a frozen keyword-only dataclass. Nodes only describe; the interpreter
(`interpreter.py`) gives them meaning, and a backend never sees them. `a + b` on nodes (or a
node and a str) builds a `Concat`, as in SGLang. The bottom layer of the frontend: it imports
nothing of sgl_lite but the light `sgl_lite.common`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sgl_lite.common.regex import dtype_to_regex

ROLES = ("system", "user", "assistant")

# The types `gen(dtype=...)` takes; each becomes a regex (SGLang's patterns).
DTYPES: tuple[type, ...] = (int, float, bool, str)


class Expr:
    """Base of every IR node: supports `+` (concatenation) and refuses to pose as text."""

    def __add__(self, other: Any) -> Concat:
        return Concat.of(self, other)

    def __radd__(self, other: Any) -> Concat:
        return Concat.of(other, self)

    def __format__(self, spec: str) -> str:
        raise TypeError(
            f"{type(self).__name__} is a placeholder, not text: name it (e.g. gen('answer')), "
            "add it with `s += ...`, then read the result with s['answer']"
        )

    def __bool__(self) -> bool:
        raise TypeError(
            f"{type(self).__name__} has no truth value before it runs: add it with `s += ...` "
            "and test the variable it sets (s['name'])"
        )


@dataclass(frozen=True, kw_only=True)
class SamplingArgs:
    """`gen`'s sampling arguments; None means "fall back to the run() defaults"."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    n: int | None = None
    stop: str | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: str | tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: type | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None  # SGLang's `ebnf` sampling param (a context-free grammar)

    def given(self) -> dict[str, Any]:
        """The arguments that were set (not None)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


# The names `gen(...)` shares with SGLang's sampling arguments, in `SamplingArgs`' order.
SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingArgs))


@dataclass(frozen=True, kw_only=True)
class Text(Expr):
    """Constant text."""

    text: str


@dataclass(frozen=True, kw_only=True)
class Gen(Expr):
    """Generated text stored in variable `name` (None: text only)."""

    name: str | None
    sampling: SamplingArgs = field(default_factory=SamplingArgs)
    timeout: float | None = None  # seconds this step may take; None: run()'s, if any


@dataclass(frozen=True, kw_only=True)
class Select(Expr):
    """One of `choices`, scored as continuations of the prompt, stored in `name`."""

    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    choices_method: Any = None  # a ChoicesMethod; None = token_length_normalized


@dataclass(frozen=True, kw_only=True)
class RoleBegin(Expr):
    """Opens a chat message of `role`."""

    role: str


@dataclass(frozen=True, kw_only=True)
class RoleEnd(Expr):
    """Closes the open chat message of `role`."""

    role: str


@dataclass(frozen=True, kw_only=True)
class VarScopeBegin(Expr):
    """Starts capturing the text added from here into variable `name`."""

    name: str


@dataclass(frozen=True, kw_only=True)
class VarScopeEnd(Expr):
    """Ends the capture of variable `name`."""

    name: str


@dataclass(frozen=True, kw_only=True)
class SetVar(Expr):
    """Sets a variable (and its meta info) without adding text; used by `set_var` and join."""

    name: str
    value: Any
    meta_info: Any = None


@dataclass(frozen=True, kw_only=True)
class Concat(Expr):
    """A sequence of nodes (never nested: `of` flattens)."""

    items: tuple[Expr, ...]

    @staticmethod
    def of(*parts: Any) -> Concat:
        """The flat concatenation of `parts` (str, nodes, lists of them)."""
        return Concat(items=tuple(leaf for part in parts for leaf in flatten(to_expr(part))))


def to_expr(value: Any) -> Expr:
    """A str becomes `Text`; a list/tuple a `Concat`; an `Expr` stays itself."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(text=value)
    if isinstance(value, (list, tuple)):
        return Concat.of(*value)
    raise TypeError(
        f"cannot add a {type(value).__name__} to a program: add a str or an sgl expression "
        f"(gen, select, user(...), ...); got {value!r:.80}"
    )


def flatten(expr: Expr) -> Iterator[Expr]:
    """The leaves of an expression, in order (concatenations dissolved)."""
    if isinstance(expr, Concat):
        for item in expr.items:
            yield from flatten(item)
    else:
        yield expr


def role(name: str, expr: Any = None) -> Concat:
    """`name`'s message holding `expr` (an empty message when None); roles cannot nest."""
    if expr is None:
        return Concat(items=(RoleBegin(role=name), RoleEnd(role=name)))
    body = to_expr(expr)
    for leaf in flatten(body):
        if isinstance(leaf, (RoleBegin, RoleEnd)):
            raise ValueError(
                f"nested roles: {name}(...) contains {leaf.role}(...); "
                "roles cannot be nested, add them one after another"
            )
    return Concat.of(RoleBegin(role=name), body, RoleEnd(role=name))


def dtype_regex(dtype: type) -> str:
    """The regex that constrains `gen(dtype=...)` (one of `DTYPES`)."""
    if dtype not in DTYPES:
        raise ValueError(f"gen(dtype=...) must be one of int, float, bool, str; got {dtype!r}")
    return dtype_to_regex(dtype)

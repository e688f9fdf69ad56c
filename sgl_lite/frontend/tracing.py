"""Tracing: run a program on placeholder arguments to find the text every run starts with.

The tracer adds constant text and roles exactly as the interpreter would, and stops at the
first thing that depends on an argument or on the model (a placeholder used as a value, a
gen, a select, a variable read, a fork). What it has by then is the batch's common prefix.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from sgl_lite.frontend import ir
from sgl_lite.frontend.chat_template import ChatTemplate
from sgl_lite.frontend.transcript import Transcript

_MAX_TRACE_CHARS = 1 << 20


class StopTrace(Exception):
    """The traced program reached something that is not constant."""


class Placeholder(ir.Expr):
    """Stands for a program argument; any use of its value ends the trace.

    `"text" + arg` still builds an expression, so the constant text before it is kept.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTrace(f"argument {self._name!r} is used")

    def __add__(self, other: Any) -> Any:
        return ir.Concat.of(self, other) if isinstance(other, (str, ir.Expr)) else self._stop()

    def __radd__(self, other: Any) -> Any:
        return ir.Concat.of(other, self) if isinstance(other, (str, ir.Expr)) else self._stop()

    __str__ = __format__ = __bool__ = __eq__ = __ne__ = _stop
    __lt__ = __gt__ = __le__ = __ge__ = __len__ = __iter__ = __getitem__ = _stop
    __contains__ = __int__ = __float__ = __mul__ = __rmul__ = __mod__ = __call__ = _stop
    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        raise StopTrace(f"argument {self._name!r} is used")


class TraceState:
    """A stand-in for ProgramState that records constant text only."""

    def __init__(self, template: ChatTemplate) -> None:
        self.t = Transcript(template)

    def __iadd__(self, other: Any) -> TraceState:
        try:
            expr = ir.to_expr(other)
        except TypeError:
            raise StopTrace("a non-constant value is added") from None
        for leaf in ir.flatten(expr):
            if isinstance(leaf, ir.Text):
                self.t.fill(leaf.text)
            elif isinstance(leaf, ir.RoleBegin):
                self.t.role_begin(leaf.role)
            elif isinstance(leaf, ir.RoleEnd):
                self.t.role_end(leaf.role)
            else:
                raise StopTrace(type(leaf).__name__)
            if len(self.t.text) > _MAX_TRACE_CHARS:
                raise StopTrace("too long")
        return self

    @contextlib.contextmanager
    def _scope(self, role: str) -> Iterator[None]:
        self += ir.RoleBegin(role=role)
        yield
        self += ir.RoleEnd(role=role)

    def _role(self, role: str, expr: Any) -> Any:
        if expr is None:
            return self._scope(role)
        self += ir.role(role, expr)
        return None

    def system(self, expr: Any = None) -> Any:
        """Records a system message (as `ProgramState.system` does)."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        """Records a user message (as `ProgramState.user` does)."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        """Records a assistant message (as `ProgramState.assistant` does)."""
        return self._role("assistant", expr)

    def __getitem__(self, name: str) -> Any:
        raise StopTrace(f"variable {name!r} is read")

    def __getattr__(self, name: str) -> Any:
        raise StopTrace(f"s.{name} is used")


def trace_prefix(program: Any, template: ChatTemplate, fixed: dict[str, Any]) -> str:
    """The constant prefix of `program` (an SglFunction) when only `fixed` arguments are known."""
    state = TraceState(template)
    kwargs: dict[str, Any] = {}
    for param in list(inspect.signature(program.func).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        kwargs[param.name] = fixed.get(param.name, Placeholder(param.name))
    # A trace stops wherever the program needs a real value; what it built so far is the prefix.
    with contextlib.suppress(Exception):
        program.func(state, **kwargs)
    text = state.t.text
    return text if len(text) > len(template.begin_text) else ""

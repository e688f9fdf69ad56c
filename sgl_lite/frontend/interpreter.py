"""ProgramState: the interpreter of IR nodes, one worker thread per state.

`s += expr` only queues work, so a program's Python runs ahead of the model until it reads a
variable (`s["x"]` blocks until set). The worker thread exists while the queue has work and
executes nodes in order, calling the backend; many states run at once, so a batch of programs
reaches the engine together. A failing step records the error, drops the queue and wakes every
reader: nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from sgl_lite.frontend import ir, sampling
from sgl_lite.frontend.backends.base import Backend
from sgl_lite.frontend.transcript import Transcript

if TYPE_CHECKING:
    from sgl_lite.cache_view import CacheReport
    from sgl_lite.frontend.fork import ProgramStateGroup

_NAMED = (ir.Gen, ir.Select, ir.VarScopeEnd, ir.SetVar)


class ProgramError(RuntimeError):
    """A program step failed; `__cause__` is the original exception."""


class ProgramState:
    """The state of one running program (SGLang's `ProgramState`)."""

    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any] | None = None,
        *,
        stream: bool = False,
        name: str = "program",
        transcript: Transcript | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self._defaults = defaults if defaults is not None else sampling.run_defaults({})
        self._stream = stream
        self._t = transcript or Transcript(backend.chat_template)
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._scopes: dict[str, int] = {}
        self._cond = threading.Condition()
        self._queue: deque[ir.Expr] = deque()
        self._pending: dict[str, int] = {}
        self._running = False
        self._closed = False
        self._error: BaseException | None = None
        self._failed_step = ""
        self._events: list[tuple[str | None, str, bool]] = []  # (var or None, text, var done)
        self._submit_role: str | None = None
        self._owner = threading.get_ident()
        self._children: list[ProgramState] = []
        self._steps: list[tuple[str, str | None, Any]] = []  # (gen/select, name, meta_info)

    # --- adding work ------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> ProgramState:
        self.submit(other)
        return self

    def submit(self, other: Any) -> None:
        leaves = list(ir.flatten(ir.to_expr(other)))
        role = self._submit_role
        for leaf in leaves:  # roles are checked here, in the program's own thread
            if isinstance(leaf, ir.RoleBegin):
                if role is not None:
                    raise ValueError(
                        f"nested roles: {leaf.role} begins while {role} is open; "
                        f"end {role} first (roles cannot be nested)"
                    )
                role = leaf.role
            elif isinstance(leaf, ir.RoleEnd):
                if role != leaf.role:
                    raise ValueError(
                        f"{leaf.role}_end() without a matching "
                        f"{leaf.role}_begin() (the open role is {role!r})"
                    )
                role = None
        with self._cond:
            self._submit_role = role
            if self._error is not None:
                # NOTE: a failed program has no worker: queued work would never drain, and
                # sync() would wait forever. Readers get the recorded error instead.
                return
            for leaf in leaves:
                if isinstance(leaf, _NAMED) and leaf.name is not None:
                    self._pending[leaf.name] = self._pending.get(leaf.name, 0) + 1
            self._queue.extend(leaves)
            if not self._running and self._error is None:
                self._running = True
                threading.Thread(target=self._work, name=f"sgl-{self.name}", daemon=True).start()

    def set_var(self, name: str, value: Any) -> None:
        self.submit(ir.SetVar(name=name, value=value))

    __setitem__ = set_var

    # --- reading ----------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        """The variable's value, waiting until the steps that set it have run."""
        with self._cond:
            while True:
                if not self._pending.get(name) and name in self._vars:
                    return self._vars[name]
                if self._error is not None:
                    raise self._program_error(f"variable {name!r} was not set") from self._error
                if self._idle() and (self._closed or threading.get_ident() == self._owner):
                    raise KeyError(
                        f"variable {name!r} is never set in this program: name a "
                        f"gen/select with it (gen({name!r}, ...)) or use s.set_var"
                    )
                self._cond.wait()

    __getitem__ = get_var

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        """Meta info of the step that set `name` (tokens, cached tokens, finish reason, scores)."""
        self.get_var(name)
        return self._meta.get(name)

    def cache_report(self) -> CacheReport:
        """Prompt tokens, cached tokens and hit rate of each gen/select so far (forks after)."""
        from sgl_lite.cache_view import CacheReport

        states, records = [self], []
        while states:
            state = states.pop(0)
            state.sync()
            records += state._steps
            states += state._children
        return CacheReport.from_records(records)

    def text(self) -> str:
        self.sync()
        return self._t.text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self._t.messages]

    def sync(self) -> None:
        """Waits until every queued step has run (or the program failed)."""
        with self._cond:
            while not self._idle():
                self._cond.wait()

    def error(self) -> BaseException | None:
        """The exception that stopped this program, or None."""
        self.sync()
        return self._error

    # --- roles, scopes, forks -----------------------------------------------------------------
    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.submit(ir.RoleBegin(role=role))
        yield
        self.submit(ir.RoleEnd(role=role))

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is None:
            return self._role_scope(role)
        from sgl_lite.frontend.api import _role

        self.submit(_role(role, expr))
        return None

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything added inside the block becomes variable `name` (as text)."""
        self.submit(ir.VarScopeBegin(name=name))
        yield
        self.submit(ir.VarScopeEnd(name=name))

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` copies of this state; the shared prefix is prefilled once before they run."""
        from sgl_lite.frontend.fork import ProgramStateGroup

        if size < 1:
            raise ValueError(f"fork({size}): size must be >= 1")
        self.sync()
        if self._error is not None:
            raise self._program_error("cannot fork") from self._error
        if size > 1 and self._t.text:
            self.backend.cache_prefix(self._t.text)
        children = [self._child() for _ in range(size)]
        return ProgramStateGroup(children, self)

    def copy(self) -> ProgramState:
        return self.fork(1)[0]

    def _child(self) -> ProgramState:
        child = ProgramState(
            self.backend,
            self._defaults,
            stream=self._stream,
            name=f"{self.name}.fork",
            transcript=self._t.copy(),
        )
        child._vars, child._meta = dict(self._vars), dict(self._meta)
        child._scopes, child._submit_role = dict(self._scopes), self._submit_role
        child._owner = self._owner
        self._children.append(child)
        return child

    # --- streaming --------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yields text as it is produced: the whole program's, or one variable's."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events) and not self._finished():
                    self._cond.wait()
                new, i = self._events[i:], len(self._events)
                finished, error = self._finished(), self._error
            for name, text, done in new:
                if var_name is None:
                    if text:
                        yield text
                elif name == var_name:
                    if done:
                        return
                    if text:
                        yield text
            if finished:
                if error is not None:
                    raise self._program_error("stream ended") from error
                return

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code (the waiting happens off the event loop)."""
        sentinel = object()
        chunks = self.text_iter(var_name)
        while (chunk := await asyncio.to_thread(next, chunks, sentinel)) is not sentinel:
            yield chunk
        if return_meta_data and var_name is not None:
            yield self.get_meta_info(var_name)

    # --- the worker ---------------------------------------------------------------------------
    def close(self) -> None:
        """Marks the program's body as finished (readers of unset variables stop waiting)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for child in self._children:
            child.close()

    def _idle(self) -> bool:
        return not self._running and not self._queue

    def _finished(self) -> bool:
        return self._error is not None or (self._closed and self._idle())

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._running = False
                    self._cond.notify_all()
                    return
                item = self._queue.popleft()
            try:
                self._execute(item)
            except BaseException as exc:
                self._fail(item, exc)
                return

    def _fail(self, item: ir.Expr, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._failed_step = _describe(item)
            self._queue.clear()
            self._pending.clear()
            self._running = False
            self._cond.notify_all()

    def _program_error(self, what: str) -> ProgramError:
        exc = self._error
        return ProgramError(
            f"{what}: {self.name} failed at {self._failed_step}: {type(exc).__name__}: {exc}"
        )

    def _emit(self, var: str | None, text: str, done: bool = False) -> None:
        with self._cond:
            self._events.append((var, text, done))
            self._cond.notify_all()

    def _fill(self, text: str, var: str | None = None) -> None:
        self._t.fill(text)
        self._emit(var, text)

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self._cond:
            self._vars[name] = value
            self._meta[name] = meta
            self._pending[name] = max(self._pending.get(name, 1) - 1, 0)
            self._events.append((name, "", True))
            self._cond.notify_all()

    def _execute(self, item: ir.Expr) -> None:
        if isinstance(item, ir.Text):
            self._fill(item.text)
        elif isinstance(item, (ir.RoleBegin, ir.RoleEnd)):
            before = len(self._t.text)
            (self._t.role_begin if isinstance(item, ir.RoleBegin) else self._t.role_end)(item.role)
            self._emit(None, self._t.text[before:])
        elif isinstance(item, ir.Gen):
            self._gen(item)
        elif isinstance(item, ir.Select):
            decision = self.backend.select(self._t.prompt(), item.choices, item.choices_method)
            self._steps.append(("select", item.name, decision.meta_info))
            self._fill(decision.decision, item.name)
            self._set(item.name, decision.decision, decision.meta_info)
        elif isinstance(item, ir.VarScopeBegin):
            self._scopes[item.name] = len(self._t.text)
        elif isinstance(item, ir.VarScopeEnd):
            if item.name not in self._scopes:
                raise ValueError(f"var_scope {item.name!r} ends without beginning")
            self._set(item.name, self._t.text[self._scopes.pop(item.name) :], None)
        elif isinstance(item, ir.SetVar):
            self._set(item.name, item.value, item.meta_info)
        else:
            raise TypeError(f"unknown IR node {item!r}")

    def _gen(self, item: ir.Gen) -> None:
        request = sampling.resolve(item.sampling, self._defaults, self.backend.chat_template)
        prompt = self._t.prompt()
        if not self._stream:
            text, meta = self.backend.generate(prompt, request)
            self._fill(text, item.name)
        else:
            streamed, text, meta = "", "", {}
            stops = request.sampling_params.get("stop") or ()
            stops = [stops] if isinstance(stops, str) else stops
            for text, meta in self.backend.generate_stream(prompt, request):  # noqa: B007
                # NOTE: text that may be the start of a multi-token stop string is held back
                # until the next chunk: the final text drops a stop string, and what was
                # streamed must stay a prefix of it.
                ready = text[: _unheld_len(text, stops)]
                if ready.startswith(streamed) and len(ready) > len(streamed):
                    self._fill(ready[len(streamed) :], item.name)
                    streamed = ready
            if text.startswith(streamed) and len(text) > len(streamed):  # what was held back
                self._fill(text[len(streamed) :], item.name)
                streamed = text
            if text != streamed:  # the final text trimmed what was streamed (a stop string)
                self._t.text = self._t.text[: len(self._t.text) - len(streamed)] + text
        self._steps.append(("gen", item.name, meta))
        self._set(item.name, text, meta)

    def __repr__(self) -> str:
        return f"ProgramState({self._t.text!r})"


def _unheld_len(text: str, stops: Any) -> int:
    """How much of `text` can be streamed: all but a tail that begins some stop string."""
    keep = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                keep = min(keep, len(text) - k)
                break
    return keep


def _describe(item: ir.Expr) -> str:
    if isinstance(item, (ir.Gen, ir.Select)):
        return f"{type(item).__name__.lower()}({item.name!r})"
    if isinstance(item, ir.Text):
        return f"text {item.text[:40]!r}"
    return type(item).__name__

"""ProgramState and ProgramStateGroup: what a program's `s` is, and what `s.fork(n)` returns.

`ProgramState` is SGLang's user-facing state: `s += expr`, `s["x"]`, roles, `fork`, streaming.
It is a facade over its `Executor` (executor.py), which queues and runs the IR nodes; nothing
outside this module touches the executor. `ProgramStateGroup` drives forks together and joins
them back through `ProgramState`'s public methods only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from sgl_lite.cache_view import CacheReport
from sgl_lite.frontend import ir
from sgl_lite.frontend.backends.base import Backend
from sgl_lite.frontend.executor import Executor, ProgramError
from sgl_lite.frontend.stream_meta import incremental_meta

__all__ = ["ProgramError", "ProgramState", "ProgramStateGroup"]

_MISSING = object()
# SGLang's `concate_and_append` appends the forks' KV caches; sgl_lite appends their text (the
# radix cache finds the shared prefix again), SGLang's own fallback. `concate_joined` is ours.
_JOIN_MODES = ("gather_variable", "concate_and_append", "concate_joined")


class ProgramState:
    """The state of one running program (SGLang's `ProgramState`)."""

    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any] | None = None,
        *,
        stream: bool = False,
        name: str = "program",
    ) -> None:
        self._exec = Executor(backend, defaults, stream=stream, name=name)
        self._copied_by: ProgramStateGroup | None = None
        # What the program's function returned (SGLang's `state.ret_value`), set by `run`.
        self.ret_value: Any = None

    @classmethod
    def _over(cls, executor: Executor) -> ProgramState:
        state = cls.__new__(cls)
        state._exec = executor
        state._copied_by = None
        state.ret_value = None
        return state

    @property
    def stream_executor(self) -> Any:
        """SGLang's internal executor object, which sgl_lite does not expose."""
        raise NotImplementedError(
            "ProgramState.stream_executor is SGLang's internal; use the public methods: "
            "s.text(), s.variables(), s.meta_infos(), s.messages(), s.sync(), s.error()"
        )

    @property
    def backend(self) -> Backend:
        """The backend this program runs on."""
        return self._exec.backend

    @property
    def name(self) -> str:
        """The program's name (in errors and thread names)."""
        return self._exec.name

    # --- adding work ------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> ProgramState:
        self.submit(other)
        return self

    def submit(self, other: Any) -> None:
        """Queues `other` (text, an sgl expression, or a list of them); `s += other`."""
        self._exec.submit(list(ir.flatten(ir.to_expr(other))))

    def set_var(self, name: str, value: Any) -> None:
        """Sets variable `name` once the steps queued before it have run."""
        self.submit(ir.SetVar(name=name, value=value))

    __setitem__ = set_var

    # --- reading ----------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        """The variable's value, waiting until the steps that set it have run."""
        return self._exec.get_var(name)

    __getitem__ = get_var

    def __contains__(self, name: object) -> bool:
        """`"x" in s`: whether variable `x` is set (waiting for the steps queued to set it)."""
        return isinstance(name, str) and self._exec.has_var(name)

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        """Meta info of the step that set `name` (tokens, cached tokens, finish reason, scores)."""
        return self._exec.get_meta_info(name)

    def text(self) -> str:
        """The program's whole text, once every queued step has run."""
        self.sync()
        return self._exec.text

    def messages(self) -> list[dict[str, str]]:
        """The closed chat messages, once every queued step has run."""
        self.sync()
        return self._exec.messages()

    def variables(self) -> dict[str, Any]:
        """Every variable set, once every queued step has run."""
        self.sync()
        return self._exec.variables()

    def meta_infos(self) -> dict[str, Any]:
        """The meta info of every variable set, once every queued step has run."""
        self.sync()
        return self._exec.meta_infos()

    def sync(self) -> None:
        """Waits until every queued step has run (or the program failed)."""
        self._exec.sync()

    def cache_report(self) -> CacheReport:
        """Prompt tokens, cached tokens and hit rate of each gen/select so far (forks after)."""
        return CacheReport.from_records(self._exec.step_records())

    def error(self) -> BaseException | None:
        """The exception that stopped this program, or None."""
        self.sync()
        return self._exec.error

    def raise_for_error(self, what: str) -> None:
        """Raises ProgramError ("`what`: ... failed at ...") if this program failed."""
        if self.error() is not None:
            raise self._exec.program_error(what) from self._exec.error

    # --- roles, scopes, forks -----------------------------------------------------------------
    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.submit(ir.RoleBegin(role=role))
        yield
        self.submit(ir.RoleEnd(role=role))

    def _role(self, role: str, expr: Any) -> Any:
        if expr is None:
            return self._role_scope(role)
        self.submit(ir.role(role, expr))
        return None

    def system(self, expr: Any = None) -> Any:
        """Adds a system message; without `expr`, a `with` block that is one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        """Adds a user message; without `expr`, a `with` block that is one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        """Adds an assistant message; without `expr`, a `with` block that is one."""
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything added inside the block becomes variable `name` (as text)."""
        self.submit(ir.VarScopeBegin(name=name))
        yield
        self.submit(ir.VarScopeEnd(name=name))

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` copies of this state; the shared prefix is prefilled once before they run."""
        if size < 1:
            raise ValueError(f"fork({size}): size must be >= 1")
        self.raise_for_error("cannot fork")
        text = self._exec.text
        if size > 1 and text:
            self.backend.cache_prefix(text)
        children = [ProgramState._over(self._exec.fork_child()) for _ in range(size)]
        return ProgramStateGroup(children, self)

    def copy(self, position_ids_offset: Any = None) -> ProgramState:
        """A fork of one. Also a `with` block, as in SGLang: `with s.copy() as c:` joins the
        copy's variables back into `s` (gather_variable) when the block ends."""
        group = self.fork(1, position_ids_offset)
        child = group[0]
        child._copied_by = group
        return child

    def __enter__(self) -> ProgramState:
        if self._copied_by is None:
            raise TypeError("only s.copy() is a `with` block; use `with s.user():` for roles")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        group, self._copied_by = self._copied_by, None
        if group is None:
            return
        if exc_type is None:
            group.join()
        else:  # NOTE: the block's exception propagates; a join error must not replace it
            self.close()

    # --- running ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def body(self) -> Iterator[ProgramState]:
        """Runs a program's Python in the block: the calling thread owns the state (its read
        of a never-set variable raises instead of waiting), an exception raised in the block
        becomes the program's error (and propagates), and the state is closed after."""
        self._exec.claim()
        try:
            yield self
        except BaseException as exc:
            self._exec.sync()
            self._exec.record_failure(exc, "the program's Python code")
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Marks the program's body as finished (readers of unset variables stop waiting)."""
        self._exec.close()

    # --- streaming --------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yields text as it is produced: the whole program's, or one variable's."""
        i = 0
        while True:
            new, i, finished, error = self._exec.wait_events(i)
            for event in new:
                if var_name is None:
                    if event.text:
                        yield event.text
                elif event.var == var_name:
                    if event.done:
                        return
                    if event.text:
                        yield event.text
            if finished:
                if error is not None:
                    raise self._exec.program_error("stream ended") from error
                return

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code (the waiting happens off the event loop).

        With `return_meta_data=True` and a variable, yields `(chunk, meta_info)` pairs as
        SGLang does: each chunk with the meta info reported so far, the last with the
        variable's final meta info (finish reason, token counts). Output logprob lists hold
        only the entries new since the previous pair, and `output_token_logprobs_length`
        counts them all (SGLang's streaming meta).
        """
        sentinel = object()
        if not (return_meta_data and var_name is not None):
            chunks = self.text_iter(var_name)
            while (chunk := await asyncio.to_thread(next, chunks, sentinel)) is not sentinel:
                yield chunk
            return
        pairs = self._meta_iter(var_name)
        sent: dict[str, int] = {}
        # One pair is held back so the last can carry the final meta info.
        held: tuple[str, dict[str, Any]] | None = None
        # None ends the loop: the pairs are tuples, never None.
        while (pair := await asyncio.to_thread(next, pairs, None)) is not None:
            if held is not None:
                yield held[0], incremental_meta(held[1], sent)
            held = pair
        if held is not None:
            final = self._exec.meta_infos().get(var_name) or held[1]
            yield held[0], incremental_meta(final, sent)

    def _meta_iter(self, var_name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        i = 0
        meta: dict[str, Any] = {}
        while True:
            new, i, finished, error = self._exec.wait_events(i)
            for event in new:
                if event.var != var_name:
                    continue
                if event.done:
                    return
                meta = event.meta if event.meta else meta
                if event.text:
                    yield event.text, dict(meta)
            if finished:
                if error is not None:
                    raise self._exec.program_error("stream ended") from error
                return

    def __repr__(self) -> str:
        return f"ProgramState({self._exec.text!r})"


class ProgramStateGroup:
    """`forks += expr` adds to every fork; a list or `lambda i: ...` gives each its own."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent
        # What the parent had when it forked: join brings back only what the forks changed.
        self._base_vars = parent.variables()
        self._base_len = len(parent.text())

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # NOTE: `forks[i] += expr` adds to forks[i] in place, then assigns it back here.
        if value is not self.states[i]:
            raise ValueError(
                f"forks[{i}] = ... can only store fork {i} itself (as `forks[{i}] += expr` "
                "does); a fork group cannot take a different state"
            )

    @property
    def src_state(self) -> ProgramState:
        """The state that forked (SGLang's name for `parent`)."""
        return self.parent

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        if callable(other) and not isinstance(other, ir.Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(
                    f"adding a list of {len(other)} expressions to a fork of "
                    f"{len(self.states)}: give one per fork"
                )
            for state, expr in zip(self.states, other):
                state += expr
        else:
            for state in self.states:
                state += other
        return self

    def sync(self) -> None:
        """Waits until every fork has run what was queued."""
        for state in self.states:
            state.sync()

    def join(self, mode: str = "gather_variable") -> None:
        """Waits for every fork and brings results back into the parent.

        `gather_variable`: each variable the forks set becomes a list in the parent (meta info
        too). `concate_and_append` (SGLang's name; `concate_joined` is an alias): the forks'
        new text is appended to the parent's text, fork by fork.
        """
        if mode not in _JOIN_MODES:
            raise ValueError(
                f"join(mode={mode!r}): use 'gather_variable' or 'concate_and_append' "
                "(alias 'concate_joined')"
            )
        for state in self.states:
            state.close()
            state.raise_for_error("a fork failed")
        if mode != "gather_variable":
            self.parent += "".join(s.text()[self._base_len :] for s in self.states)
            return
        forks = [(s.variables(), s.meta_infos()) for s in self.states]
        names: dict[str, None] = {}  # ordered set: the parent sets them in first-seen order
        for variables, _ in forks:
            for name, value in variables.items():
                if self._base_vars.get(name, _MISSING) is not value:
                    names[name] = None
        for name in names:
            self.parent.submit(
                ir.SetVar(
                    name=name,
                    value=[variables.get(name) for variables, _ in forks],
                    meta_info=[meta.get(name) for _, meta in forks],
                )
            )

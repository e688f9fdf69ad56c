"""Executor: runs one program's IR nodes in order on a worker thread and holds what they made.

`submit` only queues work, so a program's Python runs ahead of the model until it reads a
variable (`get_var` blocks until set). The worker thread exists while the queue has work and
executes nodes in order, calling the backend; many executors run at once, so a batch of
programs reaches the engine together. A failing step records the error, drops the queue and
wakes every reader: nothing waits forever.

The executor is the one place that gives IR nodes meaning. It knows the nodes, the transcript,
the sampling layering and the backend protocol; the user-facing `ProgramState` (interpreter.py)
is a facade over it, and nothing else reads its fields.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from typing import Any, NamedTuple

from sgl_lite.frontend import ir, sampling
from sgl_lite.frontend.backends.base import Backend, GenRequest, Prompt
from sgl_lite.frontend.transcript import Transcript

_NAMED = (ir.Gen, ir.Select, ir.VarScopeEnd, ir.SetVar)


class ProgramError(RuntimeError):
    """A program step failed; `__cause__` is the original exception."""


class Event(NamedTuple):
    """Text a program produced: `var` is the variable it belongs to (None: outside any), and
    `done` marks that variable as set (its event carries no text); `meta` is the meta info
    the backend had reported when the text came."""

    var: str | None
    text: str
    done: bool = False
    meta: Any = None  # the generation's meta_info as of this text (None outside a gen)


class Events(NamedTuple):
    """What `Executor.wait_events` found: new events, where to continue, and the outcome."""

    new: list[Event]
    next_index: int
    finished: bool
    error: BaseException | None


class Executor:
    """The work queue, worker thread, transcript and variables of one running program."""

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
        self.defaults = defaults if defaults is not None else sampling.run_defaults({})
        self.stream = stream
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
        self._events: list[Event] = []
        self._submit_role: str | None = None
        # The thread running the program's Python: its read of a never-set variable raises
        # (nothing else could set it) instead of waiting.
        self._owner = threading.get_ident()
        self._children: list[Executor] = []
        self._steps: list[tuple[str, str | None, Any]] = []  # (gen/select, name, meta_info)

    # --- adding work --------------------------------------------------------------------------
    def submit(self, leaves: list[ir.Expr]) -> None:
        """Queues `leaves` (flat IR nodes) and starts the worker if it is idle."""
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
            if self._error is not None:
                # NOTE: a failed program runs nothing more (its queue was dropped); work queued
                # now would never run and `sync` would wait for it forever.
                return
            self._submit_role = role
            for leaf in leaves:
                if isinstance(leaf, _NAMED) and leaf.name is not None:
                    self._pending[leaf.name] = self._pending.get(leaf.name, 0) + 1
            self._queue.extend(leaves)
            if not self._running and self._error is None:
                self._running = True
                threading.Thread(target=self._work, name=f"sgl-{self.name}", daemon=True).start()

    def claim(self) -> None:
        """Makes the calling thread the one that runs the program's Python."""
        self._owner = threading.get_ident()

    def record_failure(self, exc: BaseException, step: str) -> None:
        """Records `exc` as the program's error unless a step already failed; wakes readers."""
        with self._cond:
            if self._error is None:
                self._error, self._failed_step = exc, step
            self._cond.notify_all()

    def close(self) -> None:
        """Marks the program's body as finished (readers of unset variables stop waiting)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for child in self._children:
            child.close()

    def fork_child(self) -> Executor:
        """A copy of this (idle) executor that continues on its own; closed with this one."""
        child = Executor(
            self.backend,
            self.defaults,
            stream=self.stream,
            name=f"{self.name}.fork",
            transcript=self._t.copy(),
        )
        with self._cond:
            child._vars, child._meta = dict(self._vars), dict(self._meta)
            child._scopes, child._submit_role = dict(self._scopes), self._submit_role
        child._owner = self._owner
        self._children.append(child)
        return child

    # --- reading ------------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        """The variable's value, waiting until the steps that set it have run."""
        with self._cond:
            while True:
                if not self._pending.get(name) and name in self._vars:
                    return self._vars[name]
                if self._error is not None:
                    raise self.program_error(f"variable {name!r} was not set") from self._error
                if self._idle() and (self._closed or threading.get_ident() == self._owner):
                    raise KeyError(
                        f"variable {name!r} is never set in this program: name a "
                        f"gen/select with it (gen({name!r}, ...)) or use s.set_var"
                    )
                self._cond.wait()

    def has_var(self, name: str) -> bool:
        """Whether `name` is set, once the steps queued to set it have run (never blocks on a
        variable that nothing queued sets)."""
        with self._cond:
            while self._pending.get(name) and self._error is None:
                self._cond.wait()
            return name in self._vars

    def get_meta_info(self, name: str) -> Any:
        """Meta info of the step that set `name` (waits like `get_var`)."""
        self.get_var(name)
        with self._cond:
            return self._meta.get(name)

    def sync(self) -> None:
        """Waits until every queued step has run (or the program failed)."""
        with self._cond:
            while not self._idle():
                self._cond.wait()

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped the program, or None (does not wait)."""
        return self._error

    @property
    def text(self) -> str:
        """The text so far (does not wait)."""
        return self._t.text

    def messages(self) -> list[dict[str, str]]:
        """The closed chat messages so far (copies; does not wait)."""
        return [dict(m) for m in self._t.messages]

    def variables(self) -> dict[str, Any]:
        """A copy of the variables set so far (does not wait)."""
        with self._cond:
            return dict(self._vars)

    def meta_infos(self) -> dict[str, Any]:
        """A copy of the variables' meta info so far (does not wait)."""
        with self._cond:
            return dict(self._meta)

    def step_records(self) -> list[tuple[str, str | None, Any]]:
        """(gen/select, name, meta_info) of every step run, this program's then its forks'
        (waits for each to finish its queued work)."""
        executors, records = [self], []
        while executors:
            ex = executors.pop(0)
            ex.sync()
            records += ex._steps
            executors += ex._children
        return records

    def wait_events(self, start: int) -> Events:
        """Waits for events past index `start` or the end of the program, and returns them."""
        with self._cond:
            while start >= len(self._events) and not self._finished():
                self._cond.wait()
            return Events(self._events[start:], len(self._events), self._finished(), self._error)

    def program_error(self, what: str) -> ProgramError:
        """A ProgramError saying `what` happened because of the step that failed."""
        exc = self._error
        return ProgramError(
            f"{what}: {self.name} failed at {self._failed_step}: {type(exc).__name__}: {exc}"
        )

    # --- the worker ---------------------------------------------------------------------------
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

    def _emit(self, var: str | None, text: str, meta: Any = None) -> None:
        with self._cond:
            self._events.append(Event(var, text, meta=meta))
            self._cond.notify_all()

    def _fill(self, text: str, var: str | None = None, meta: Any = None) -> None:
        self._t.fill(text)
        self._emit(var, text, meta)

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self._cond:
            self._vars[name] = value
            self._meta[name] = meta
            self._pending[name] = max(self._pending.get(name, 1) - 1, 0)
            self._events.append(Event(name, "", done=True))
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
            self._fill(decision.decision, item.name)
            self._steps.append(("select", item.name, decision.meta_info))
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
        request = sampling.resolve(
            item.sampling, self.defaults, self.backend.chat_template, timeout=item.timeout
        )
        prompt = self._t.prompt()
        n = sampling.alternatives(item.sampling, self.defaults)
        if n > 1:
            self._gen_alternatives(item, prompt, request, n)
            return
        if not self.stream:
            text, meta = self.backend.generate(prompt, request)
            self._fill(text, item.name, meta)
        else:
            streamed, text, meta = "", "", {}
            # NOTE: no hold-back here: backends stream only final text (the engine's
            # detokenizer releases nothing a stop string or stop_regex could still trim).
            for text, meta in self.backend.generate_stream(prompt, request):
                if text.startswith(streamed) and len(text) > len(streamed):
                    self._fill(text[len(streamed) :], item.name, meta)
                    streamed = text
            if text != streamed:  # a backend that streamed text it later trimmed (a stop)
                self._t.text = self._t.text[: len(self._t.text) - len(streamed)] + text
        self._steps.append(("gen", item.name, meta))
        self._set(item.name, text, meta)

    def _gen_alternatives(self, item: ir.Gen, prompt: Prompt, request: GenRequest, n: int) -> None:
        """`gen(n=k)`: k samples of the same prompt, sent together so the engine batches them
        (the prompt is prefilled once, by the prefix cache). As in SGLang, the variable is the
        list of alternatives and the text continues with the first; the meta info is the
        first's, with every alternative's under "alternatives"."""
        # NOTE: one request per alternative rather than the engine's `n`: every backend
        # (HTTP, OpenAI) can serve it, and each sample gets its own meta info.
        with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="sgl-gen-n") as pool:
            results = list(pool.map(lambda _: self.backend.generate(prompt, request), range(n)))
        texts = [r.text for r in results]
        meta = {**results[0].meta_info, "alternatives": [dict(r.meta_info) for r in results]}
        self._fill(texts[0], item.name, meta)
        self._steps.append(("gen", item.name, meta))
        self._set(item.name, texts, meta)


def _describe(item: ir.Expr) -> str:
    if isinstance(item, (ir.Gen, ir.Select)):
        return f"{type(item).__name__.lower()}({item.name!r})"
    if isinstance(item, ir.Text):
        return f"text {item.text[:40]!r}"
    return type(item).__name__

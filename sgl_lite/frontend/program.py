"""SglFunction: a decorated program; run, run_batch, bind, and tracing for prefix caching.

`run_batch` starts every program on a thread pool; each state has its own worker thread, so the
whole batch's first requests reach the backend together. Before that, the batch's constant
prefix (found by tracing the program with placeholder arguments, as SGLang does) is prefilled
once so all first prefills hit the cache. A program without a backend runs on the default one
(`globals`), which is started here, the first time a program needs it.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sgl_lite.frontend import globals as g
from sgl_lite.frontend import sampling
from sgl_lite.frontend.backends.base import Backend
from sgl_lite.frontend.interpreter import ProgramState
from sgl_lite.frontend.tracing import trace_prefix

logger = logging.getLogger("sgl_lite")
_start_lock = threading.Lock()


class SglFunction:
    """A program: `func(s, *args)` that adds to the state `s`."""

    def __init__(
        self,
        func: Callable,
        *,
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"@sgl.function decorates a function; got {func!r}")
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].name != "s":
            got = params[0].name if params else "no parameters"
            raise ValueError(
                f"@sgl.function {func.__name__}: the first parameter must be `s` "
                f"(the program state), as in `def {func.__name__}(s, ...)`; "
                f"got {got}"
            )
        self.func = func
        self.name = func.__name__
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = [p.name for p in params[1:]]
        self.arg_defaults = [p.default for p in params[1:] if p.default is not p.empty]
        self.pin_prefix_rid = None  # SGLang's attribute; prefixes are cached, never pinned
        self._signature = inspect.signature(func)
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy of this program with some arguments fixed."""
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown and not any(
            p.kind == p.VAR_KEYWORD for p in self._signature.parameters.values()
        ):
            raise TypeError(
                f"{self.name}.bind(): unknown argument(s) {unknown}; "
                f"the program takes {self.arg_names}"
            )
        return SglFunction(
            self.func,
            num_api_spec_tokens=self.num_api_spec_tokens,
            bind_arguments={**self.bind_arguments, **kwargs},
        )

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        """`program(...)` is `program.run(...)`."""
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        stream: bool = False,
        backend: Backend | None = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Runs the program once; run() keywords (max_new_tokens, stop_regex, n, temperature,
        ...) are the defaults of every gen() in it; `timeout=S` bounds each gen step to S
        seconds (a gen's own timeout wins; past it the state's error() is a StepTimeout, a
        TimeoutError). With stream=True returns at once (use text_iter). What the function
        returns is `state.ret_value`. `use_thread` is SGLang's and changes nothing: the
        program's Python always runs in the caller's thread (or a thread of its own when
        streaming) and its steps on a worker."""
        defaults, arguments = self._split(kwargs)
        backend = _resolve_backend(backend)
        state = ProgramState(backend, defaults, stream=stream, name=self.name)
        bound = self._bind(state, args, arguments)
        if stream:
            thread = threading.Thread(target=self._body, args=(state, bound, False), daemon=True)
            thread.start()
            return state
        self._body(state, bound, True)
        state.sync()
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **kwargs: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Runs the program once per kwargs dict; returns the states in the same order.

        A program that fails does not stop the others: its state's `error()` says why.
        """
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of kwargs dicts, one per program")
        batch_kwargs = [self._as_kwargs(i, a) for i, a in enumerate(batch_kwargs)]
        defaults, extra = self._split(kwargs)
        if extra:
            raise TypeError(
                f"run_batch(): unknown argument(s) {sorted(extra)}; pass program "
                "arguments inside the batch's dicts"
            )
        backend = _resolve_backend(backend)
        states, bounds = [], []
        for i, arguments in enumerate(batch_kwargs):
            if not isinstance(arguments, dict):
                raise TypeError(
                    f"run_batch item {i} is a {type(arguments).__name__}; "
                    "each item must be a dict (or a list of positional values) of the program's "
                    "arguments"
                )
            state = ProgramState(backend, defaults, name=f"{self.name}[{i}]")
            states.append(state)
            bounds.append(self._bind(state, (), arguments))  # bad arguments fail before any run
        if len(states) > 1:
            self._precache(backend)
        if num_threads == "auto":
            num_threads = max(96, (os.cpu_count() or 1) * 16)
        num_threads = max(1, min(int(num_threads), len(states) or 1))
        pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="sgl-batch")
        futures = [pool.submit(self._body, s, b, False) for s, b in zip(states, bounds)]
        pool.shutdown(wait=False)
        done = self._progress(states, futures, progress_bar)
        return done if generator_style else list(done)

    def cache(self, backend: Backend | None = None) -> str:
        """Prefills the program's constant prefix (SGLang's `cache`); returns that prefix."""
        backend = _resolve_backend(backend)
        prefix = trace_prefix(self, backend.chat_template, self.bind_arguments)
        if prefix:
            backend.cache_prefix(prefix)
        return prefix

    def trace(self, backend: Backend | None = None, **kwargs: Any) -> str:
        """The constant text this program starts with, whatever its arguments."""
        backend = _resolve_backend(backend)
        return trace_prefix(self, backend.chat_template, kwargs)

    def compile(self, *, backend: Backend | None = None) -> Any:
        """Refused: SGLang's graph compiler (`sglang.lang.compiler`) is not part of sgl_lite."""
        raise NotImplementedError(
            "SglFunction.compile: sgl_lite has no program compiler; call the function (run / "
            "run_batch) directly: its constant prefix is cached by the radix cache, and "
            "cache() prefills it ahead of time"
        )

    # --- helpers ----------------------------------------------------------------------------
    def _as_kwargs(self, i: int, arguments: Any) -> Any:
        """A run_batch item as kwargs: SGLang also takes a list/tuple of positional values."""
        if not isinstance(arguments, (list, tuple)):
            return arguments
        if len(arguments) > len(self.arg_names):
            raise TypeError(
                f"run_batch item {i} has {len(arguments)} values; {self.name} takes "
                f"{self.arg_names}"
            )
        return dict(zip(self.arg_names, arguments))

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = (*sampling.RUN_ARGS, *sampling.REQUEST_OPTIONS)
        run_args = {k: v for k, v in kwargs.items() if k in names}
        other = {k: v for k, v in kwargs.items() if k not in names}
        return sampling.run_defaults(run_args), other

    def _bind(
        self, state: ProgramState, args: tuple, kwargs: dict[str, Any]
    ) -> inspect.BoundArguments:
        try:
            return self._signature.bind(state, *args, **{**self.bind_arguments, **kwargs})
        except TypeError as exc:
            raise TypeError(f"{self.name}{self._signature}: {exc}") from None

    def _body(self, state: ProgramState, bound: inspect.BoundArguments, reraise: bool) -> None:
        try:
            with state.body():
                state.ret_value = self.func(*bound.args, **bound.kwargs)
        except BaseException:
            if reraise:
                raise

    def _precache(self, backend: Backend) -> None:
        try:
            prefix = trace_prefix(self, backend.chat_template, self.bind_arguments)
        except Exception as exc:
            logger.debug("tracing %s for its prefix failed: %s", self.name, exc)
            return
        if prefix:
            backend.cache_prefix(prefix)

    @staticmethod
    def _progress(
        states: list[ProgramState], futures: list[concurrent.futures.Future], progress_bar: bool
    ) -> Iterator[ProgramState]:
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm  # NOTE: on use, so `import sgl_lite` does not load it

            bar = tqdm(total=len(states), desc="run_batch")
        try:
            if bar is not None:
                prompt = cached = 0
                for future in concurrent.futures.as_completed(futures):
                    report = states[futures.index(future)].cache_report()
                    prompt, cached = prompt + report.prompt_tokens, cached + report.cached_tokens
                    bar.set_postfix_str(f"cache hit {cached / max(prompt, 1):.1%}", refresh=False)
                    bar.update(1)
            for state, future in zip(states, futures):
                future.result()
                state.sync()
                yield state
        finally:
            if bar is not None:
                bar.close()


def default_backend() -> Backend:
    """The default backend; the first call without one starts it (`sgl.Runtime()` on the
    embedded model, by the factory `sgl_lite` registers)."""
    with _start_lock:  # two programs starting at once must not start two engines
        backend = g.get_default_backend()
        if backend is None:
            factory = g.get_default_backend_factory()
            if factory is None:
                raise RuntimeError(
                    "no default backend: call sgl.set_default_backend(sgl.Runtime()) or pass "
                    "backend=... to run()"
                )
            logger.info("no default backend set: starting one on the embedded model")
            backend = factory()
            g.set_default_backend(backend)
        return backend


def flush_cache(backend: Any = None, empty_cache: bool = True) -> bool:
    """Empties the default (or given) backend's prefix cache (SGLang's `empty_cache`, which also
    frees the GPU allocator's cache, is passed on to a remote server and accepted otherwise)."""
    backend = backend or default_backend()
    if "empty_cache" in inspect.signature(backend.flush_cache).parameters:
        return backend.flush_cache(empty_cache=empty_cache)
    return backend.flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The default (or given) backend's server info (cache hit rate, config, ...)."""
    return (backend or default_backend()).get_server_info()


def _resolve_backend(backend: Backend | None) -> Backend:
    backend = backend if backend is not None else default_backend()
    return getattr(backend, "backend", backend)  # a Runtime wraps a backend

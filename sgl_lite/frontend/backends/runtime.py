"""Runtime: SGLang's `sgl.Runtime`, a handle on a backend chosen by its argument.

`Runtime()` starts the in-process engine on the embedded model, `Runtime(model_path=...)` on
another, `Runtime("http://host:port")` connects to a running server. Extra keyword arguments
go to the Engine (num_threads, max_total_tokens, ...).
"""

from __future__ import annotations

from typing import Any

from sgl_lite.frontend import sampling
from sgl_lite.frontend.backends.base import Backend
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.backends.runtime_endpoint import RuntimeEndpoint
from sgl_lite.frontend.interpreter import ProgramState


class Runtime:
    """A handle on the in-process engine or a remote server (see the module docstring)."""

    def __init__(
        self,
        model_path_or_url: str | None = None,
        *,
        model_path: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        target = model_path if model_path is not None else model_path_or_url
        if model_path is not None and model_path_or_url is not None:
            raise TypeError("Runtime() takes a model path or a URL once, not both")
        if isinstance(target, str) and target.startswith(("http://", "https://")):
            self.backend: Backend = RuntimeEndpoint(target, api_key=api_key, **kwargs)
        else:
            self.backend = EngineBackend(target, **kwargs)

    @property
    def endpoint(self) -> Backend:
        """The backend this runtime wraps (SGLang's name)."""
        return self.backend

    @property
    def engine(self) -> Any:
        """The in-process Engine (None for a remote server)."""
        return getattr(self.backend, "engine", None)

    def run(self, *exprs: Any, **run_kwargs: Any) -> Any:
        """Runs an anonymous program made of `exprs`; returns its state once done."""
        unknown = [
            k for k in run_kwargs if k not in (*sampling.RUN_ARGS, *sampling.REQUEST_OPTIONS)
        ]
        if unknown:
            raise TypeError(
                f"Runtime.run(): unknown argument(s) {unknown}; it takes the "
                f"expressions and run() defaults {list(sampling.RUN_ARGS)}"
            )
        state = ProgramState(self.backend, sampling.run_defaults(run_kwargs), name="run")
        for expr in exprs:
            state += expr
        state.close()
        state.sync()
        return state

    def __getattr__(self, name: str) -> Any:  # generate, select, cache_prefix, chat_template...
        if name == "backend":
            raise AttributeError(name)
        return getattr(self.backend, name)

    def flush_cache(self) -> bool:
        """Empties the backend's prefix cache."""
        return self.backend.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        """The backend's server info (cache hit rate, config, ...)."""
        return self.backend.get_server_info()

    def shutdown(self) -> None:
        """Stops the engine (or closes the connection)."""
        self.backend.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

"""The process-wide default backend (`sgl.set_default_backend`) and the calls that use it."""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger("sgl_lite")

_lock = threading.Lock()
_default: Any = None


def set_default_backend(backend: Any) -> None:
    """Makes `backend` (a Runtime, RuntimeEndpoint, OpenAI or Engine backend) the default."""
    global _default
    if backend is not None and not hasattr(getattr(backend, "backend", backend), "generate"):
        raise TypeError(
            f"set_default_backend takes a backend (sgl.Runtime(), "
            f"sgl.RuntimeEndpoint(url), sgl.OpenAI(model)); got {backend!r}"
        )
    with _lock:
        _default = backend


def get_default_backend() -> Any:
    """The default backend; the first call without one starts the in-process engine."""
    global _default
    with _lock:
        if _default is None:
            from sgl_lite.frontend.backends.runtime import Runtime

            logger.info("no default backend set: starting sgl.Runtime() on the embedded model")
            _default = Runtime()
        return _default


def flush_cache(backend: Any = None) -> bool:
    """Empties the default (or given) backend's prefix cache."""
    return (backend or get_default_backend()).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The default (or given) backend's server info (cache hit rate, config, ...)."""
    return (backend or get_default_backend()).get_server_info()

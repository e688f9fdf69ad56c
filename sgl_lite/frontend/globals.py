"""The process-wide default backend (`sgl.set_default_backend`) and how to make one.

A store only: reading it never starts anything. The program layer (`program.default_backend`)
calls the factory the first time a program runs without a backend; `sgl_lite/__init__.py`
registers the factory (`sgl.Runtime()` on the embedded model), since the concrete backends sit
above every module of the frontend's core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_default: Any = None
_factory: Callable[[], Any] | None = None


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
    """The default backend, or None when none was set or started yet."""
    with _lock:
        return _default


def set_default_backend_factory(factory: Callable[[], Any] | None) -> None:
    """Registers what makes the default backend when a program first needs one."""
    global _factory
    with _lock:
        _factory = factory


def get_default_backend_factory() -> Callable[[], Any] | None:
    """The registered factory of the default backend, or None."""
    with _lock:
        return _factory

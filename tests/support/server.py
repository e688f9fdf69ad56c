"""The HTTP app served in process: a real uvicorn server on a free loopback port, in a thread,
and small HTTP helpers (`processes.py` runs `python -m sgl_lite.launch_server` as a child).

`url = url_fixture(**create_app_kwargs)` in a test module serves the `engine` fixture in scope
there (the session's shared engine from tests/conftest.py, or the module's own
`engine = engine_fixture(**engine_kwargs)` when it needs another configuration) for the module;
`serve(create_app(engine, ...))` does the same inside one test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import NUM_THREADS


def make_engine(**kwargs: Any):
    """An engine of its own for a server test (small pool, test thread count, `kwargs`)."""
    from sgl_lite.backend.engine import Engine

    return Engine(**{"num_threads": NUM_THREADS, "max_total_tokens": 8192, **kwargs})


def engine_fixture(**kwargs: Any) -> Any:
    """A module-scoped `engine` fixture of `make_engine(**kwargs)`, shut down after the module
    (`engine = engine_fixture(request_timeout=5)`); without one, `engine` is the session's."""

    @pytest.fixture(scope="module")
    def engine() -> Iterator[Any]:
        eng = make_engine(**kwargs)
        yield eng
        eng.shutdown()

    return engine


def url_fixture(name: str = "url", **app_kwargs: Any) -> Any:
    """A module-scoped fixture `name` (default "url"): `create_app(engine, **app_kwargs)`
    served on loopback."""

    @pytest.fixture(scope="module", name=name)
    def url(engine: Any) -> Iterator[str]:
        from sgl_lite.server import create_app

        with serve(create_app(engine, **app_kwargs)) as base:
            yield base

    return url


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Runs `app` under uvicorn on 127.0.0.1 in a daemon thread; yields its base URL."""
    import uvicorn  # NOTE: here, as conftest imports this module where no server runs (cuda)

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def post(url: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    """POST `body` as JSON to `url + path` (a generation's timeout)."""
    return httpx.post(f"{url}{path}", json=body, timeout=120, **kw)


def server_info(url: str, **headers: str) -> dict:
    """GET /get_server_info."""
    response = httpx.get(f"{url}/get_server_info", headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()


def wait_idle(url: str, timeout: float = 60) -> dict:
    """Polls until no request is running or waiting; returns the last server info."""
    deadline = time.monotonic() + timeout
    while True:
        info = server_info(url)
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"server still busy after {timeout} s: {info}")
        time.sleep(0.1)


def flush(url: str) -> dict:
    """Waits for idle, flushes the cache, and returns the server info after it."""
    wait_idle(url)
    response = httpx.post(f"{url}/flush_cache", timeout=30)
    assert response.status_code == 200, response.text
    return server_info(url)


def sse_events(lines: Iterator[str]) -> Iterator[dict | str]:
    """Decodes `data:` lines of an SSE stream: dicts, then the final "[DONE]"."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        yield data if data == "[DONE]" else json.loads(data)

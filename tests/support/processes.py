"""`python -m sgl_lite.launch_server` as a child process: `running(*flags)` starts a server and
yields it once /health answers (`running_many` several at once); `launch(*flags)` runs one that
must fail before serving.

A test module that imports `running`, `running_many`, `launch` or `ENV` from here starts server
processes: it lives in tests/process/ (tests/conftest.py refuses it anywhere lighter).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import httpx

from tests.support import NUM_THREADS
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
# A child server imports this checkout's sgl_lite and runs the tests' thread count.
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "SGL_LITE_NUM_THREADS": str(NUM_THREADS)}


def launch(*flags: str, timeout: float = 10) -> subprocess.CompletedProcess:
    """Runs launch_server to completion (for flags that must fail before serving)."""
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


class Server(NamedTuple):
    """A launched server process: its loopback URL, its log file and the process."""

    url: str
    log: Path
    proc: subprocess.Popen


@contextlib.contextmanager
def running(*flags: str, startup: float = 180) -> Iterator[Server]:
    """Starts a server on a free port (binding 0.0.0.0); yields it once /health answers; stops
    it (if it still runs) afterwards."""
    with running_many([flags], startup=startup) as (server,):
        yield server


@contextlib.contextmanager
def running_many(
    flag_sets: Sequence[Sequence[str]], startup: float = 180
) -> Iterator[list[Server]]:
    """`running` for several servers at once, one per flag set: all are started before any is
    waited for, so their start-ups (mostly imports and a model load on one core each) overlap;
    yields them once every /health answers; stops them all afterwards."""
    servers: list[Server] = []
    ports: set[int] = set()  # none bound yet: two free_port() calls could give the same one
    try:
        for flags in flag_sets:
            servers.append(_start(flags, ports))
        deadline = time.monotonic() + startup
        for server in servers:
            _wait_for_health(server, deadline, startup)
        yield servers
    finally:
        for server in servers:
            server.proc.terminate()
        for server in servers:
            try:
                server.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
            server.log.unlink(missing_ok=True)


def _start(flags: Sequence[str], taken: set[int]) -> Server:
    """Starts `python -m sgl_lite.launch_server` with `flags` on a free port not in `taken`
    (which it joins), its output to a log file; returns at once."""
    port = free_port()
    while port in taken:
        port = free_port()
    taken.add(port)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"sgl_lite-launch-{port}.log"
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--model-path", "default"]
    cmd += ["--host", "0.0.0.0", "--port", str(port), *flags]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    return Server(f"http://127.0.0.1:{port}", log, proc)


def _wait_for_health(server: Server, deadline: float, startup: float) -> None:
    """Returns once the server's /health answers 200; raises if it exits or `deadline` passes."""
    while True:
        if server.proc.poll() is not None:
            raise AssertionError(
                f"server exited {server.proc.returncode}: {server.log.read_text()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"no /health after {startup} s: {server.log.read_text()}")
        time.sleep(0.25)

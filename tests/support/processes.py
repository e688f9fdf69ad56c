"""`python -m sgl_lite.launch_server` as a child process: `running(*flags)` starts a server and
yields it once /health answers; `launch(*flags)` runs one that must fail before serving.

A test module that imports `running`, `launch` or `ENV` from here starts server processes: the
`process` tier (tests/conftest.py reads that from the module's imports).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
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
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"sgl_lite-launch-{port}.log"
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--model-path", "default"]
    cmd += ["--host", "0.0.0.0", "--port", str(port), *flags]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"no /health after {startup} s: {log.read_text()}")
            time.sleep(0.25)
        yield Server(url, log, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)

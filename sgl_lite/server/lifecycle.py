"""Graceful shutdown: a uvicorn server that drains its engine on SIGTERM / SIGINT, then exits 0.

On the first signal uvicorn stops accepting connections and waits for the open ones; meanwhile
a drain thread gives the engine's in-flight requests `shutdown_timeout` seconds to finish, then
aborts what is left, so every client still gets an answer (its `finish_reason` an abort with the
reason) before the connections close. A second SIGINT forces the exit, as in uvicorn.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

logger = logging.getLogger("sgl_lite.server")

_DELIVERY_GRACE = 5.0  # after the aborts: time for the last answers to reach their clients
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """`uvicorn.Server` that finishes or aborts the engine's work within `shutdown_timeout`."""

    def __init__(self, config: uvicorn.Config, engine: Any, shutdown_timeout: float) -> None:
        if not shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {shutdown_timeout}")
        config.timeout_graceful_shutdown = int(shutdown_timeout + _DELIVERY_GRACE)
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.drained = threading.Event()
        self._draining = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Our handler for SIGINT/SIGTERM while serving (main thread only)."""
        # NOTE: unlike uvicorn's, the signal is not raised again after serving: a server that
        # drained as asked has done its job and exits with status 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stops accepting (uvicorn) and starts draining the engine, once."""
        super().handle_exit(sig, frame)
        if not self._draining:
            self._draining = True
            logger.info(
                "signal %d: draining in-flight requests (up to %g s)", sig, self.shutdown_timeout
            )
            threading.Thread(target=self.drain, name="sgl_lite-drain", daemon=True).start()

    def drain(self) -> None:
        """Waits for the engine to go idle, at most `shutdown_timeout`; then aborts the rest."""
        deadline = time.monotonic() + self.shutdown_timeout
        try:
            while time.monotonic() < deadline:
                info = self.engine.get_server_info()
                if not (info["num_running_reqs"] or info["num_waiting_reqs"]):
                    return
                time.sleep(0.05)
            aborted = self.engine.abort_all(
                f"server shutting down: not finished within {self.shutdown_timeout:g} s"
            )
            logger.warning("shutdown: aborted %d unfinished request(s)", aborted)
        finally:
            self.drained.set()

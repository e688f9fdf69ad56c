"""LoopThread: the engine's loop thread, started when a message arrives, ended when idle.

An idle engine holds no thread, and so no OpenMP workers: a thread's OpenMP team lives as long as
the thread, and while two teams exist libgomp makes every kernel of both wait for sleeping workers
(see omp_threads). So a second engine in the process, or the caller's own tensor work, runs at
full speed while this engine has nothing to do, and a busy engine's step is never slowed by an
idle one. Restarting costs one thread start and one team (well under a millisecond).

The protocol: a sender queues its message first and then calls `wake()`; the loop ends only
through `retire(still_idle)`, which checks under the same lock that nothing has been queued since.
So a message is never left without a thread to read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class LoopThread:
    """Runs `target` on a daemon thread whenever woken and not already running."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target = target
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Starts the loop unless it runs; call it after queuing what the loop is to read."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def retire(self, still_idle: Callable[[], bool]) -> bool:
        """Called by the loop: True (and the loop must return at once) if `still_idle()` holds
        under the lock `wake` takes, so a message queued before that wake finds a new thread."""
        with self._lock:
            if not still_idle():
                return False
            self._thread = None
            return True

    def join(self, timeout: float) -> None:
        """Waits for the running loop, if any, to return."""
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether a loop thread is running now."""
        with self._lock:
            return self._thread is not None

    def _run(self) -> None:
        try:
            self._target()
        finally:
            with self._lock:  # a loop that returned without retiring (stopped, or it raised)
                if self._thread is threading.current_thread():
                    self._thread = None

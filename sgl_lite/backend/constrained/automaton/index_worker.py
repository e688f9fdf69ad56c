"""outlines-core index builds in child processes, so that a build nobody waits for can be stopped.

An index build is one call into outlines-core's Rust code that runs seconds to minutes for some
regexes (Unicode classes, long bounded strings) and cannot be interrupted: on a thread, a build
whose compile timed out would go on burning a core until it ended. In a child process it is
stopped by killing the process.

`IndexWorkers` keeps such processes for one set of vocabularies (sent to each once, at its
start) and reuses an idle one for the next build, so a build pays a pipe round trip, not a
process start. The child runs this file as a script and imports only the standard library and
outlines-core (no torch, no sgl_lite), so it starts in tens of milliseconds.

Protocol, over the child's stdin and stdout: frames of an 8-byte little-endian length and a
pickle. The parent sends the vocabularies, then one regex per build; the child answers each
with ("ok", indexes) or ("error", message). The child exits when its stdin closes or its
parent is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

logger = logging.getLogger("sgl_lite")

_LENGTH = struct.Struct("<Q")
KEEP_IDLE = 1  # idle workers kept for the next build; the others exit when their build ends
_PARENT_CHECK_S = 1.0


class IndexBuildError(Exception):
    """outlines-core refused the regex (the child's message)."""


class BuildStopped(Exception):
    """The build was stopped (`IndexJob.stop`; `stopped` True) or its worker died before
    answering (`stopped` False)."""

    def __init__(self, message: str, *, stopped: bool) -> None:
        super().__init__(message)
        self.stopped = stopped


class WorkersUnavailable(Exception):
    """No worker process could be started; the caller builds in its own thread instead."""


class IndexJob:
    """One build running in a worker: its result, and the means to stop it."""

    def __init__(self, pool: IndexWorkers, worker: _Worker, regex: str) -> None:
        self._pool = pool
        self._worker = worker
        self._lock = threading.Lock()
        self._done = False
        self._stopped = False
        self.pid = worker.process.pid
        worker.send(regex)

    def result(self) -> tuple[Any, ...]:
        """Blocks until the indexes (one per vocabulary, in the pool's order) are built.

        Raises IndexBuildError if outlines-core refused the regex, BuildStopped if the build
        was stopped or its worker died."""
        try:
            status, value = self._worker.receive()
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            with self._lock:
                self._done = True
                stopped = self._stopped
            self._pool.discard(self._worker)
            if stopped:
                raise BuildStopped("the index build was stopped", stopped=True) from None
            self._pool.died(exc)
            raise BuildStopped(f"the index worker died: {exc!r}", stopped=False) from None
        with self._lock:
            self._done = True
            stopped = self._stopped  # a kill that came as the answer did: not reusable
        self._pool.answered += 1
        if stopped:
            self._pool.discard(self._worker)
        else:
            self._pool.release(self._worker)
        if status != "ok":
            raise IndexBuildError(value)
        return tuple(value)

    def stop(self) -> None:
        """Kills the worker if the build still runs (its CPU is freed at once); idempotent,
        and never touches a worker that has answered (it may serve another build by then)."""
        with self._lock:
            if self._done:
                return
            self._stopped = True
            self._worker.kill()


class IndexWorkers:
    """Child processes that build outlines-core indexes over fixed vocabularies.

    `start(regex)` hands the build to an idle worker or a new one (as many run at once as
    builds are asked for) and returns its `IndexJob`. When no worker can be started (no
    interpreter, a pickling failure), or the first one dies before answering anything (an
    interpreter that is not this Python), it raises WorkersUnavailable with the reason, logged
    once, and every later call raises it at once: the caller builds in-thread (`unavailable`).
    """

    def __init__(self, vocabularies: tuple[Any, ...], *, executable: str | None = None) -> None:
        self._vocabularies = vocabularies
        self._payload: bytes | None = None  # the pickled vocabularies, made at the first start
        self._executable = executable or sys.executable
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._unavailable: str | None = None
        self._closed = False
        self.started = 0  # worker processes started, for tests and diagnostics
        self.answered = 0  # builds a worker answered (an index or outlines-core's refusal)

    @property
    def unavailable(self) -> bool:
        """Whether builds go in-thread for good (no worker could start or answer)."""
        return self._unavailable is not None

    def died(self, exc: BaseException) -> None:
        """A worker died before answering: where none ever answered, workers are given up."""
        if self.answered == 0:
            self._disable(f"the first index worker died before answering ({exc!r})")

    def start(self, regex: str) -> IndexJob:
        """Starts building the indexes of `regex`; WorkersUnavailable if no worker can run."""
        with self._lock:
            if self._unavailable is not None:
                raise WorkersUnavailable(self._unavailable)
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = self._spawn()
        return IndexJob(self, worker, regex)

    def release(self, worker: _Worker) -> None:
        """Takes back a worker whose build ended: kept idle, or let go beyond KEEP_IDLE."""
        with self._lock:
            if not self._closed and len(self._idle) < KEEP_IDLE:
                self._idle.append(worker)
                return
        worker.close()

    def discard(self, worker: _Worker) -> None:
        """Reaps a worker that was killed or died."""
        worker.kill()
        worker.reap()

    def close(self) -> None:
        """Lets the idle workers go; builds in flight finish and their workers exit after."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def _spawn(self) -> _Worker:
        try:
            if self._payload is None:
                self._payload = pickle.dumps(self._vocabularies)
            worker = _Worker(self._executable, self._payload)
        except (OSError, pickle.PicklingError, TypeError) as exc:
            reason = self._disable(f"cannot start an index worker process ({exc!r})")
            raise WorkersUnavailable(reason) from None
        with self._lock:
            self.started += 1
        return worker

    def _disable(self, why: str) -> str:
        """Gives up on worker processes for good, logging why once; returns the reason."""
        reason = f"{why}; indexes build in-thread"
        with self._lock:
            first = self._unavailable is None
            if first:
                self._unavailable = reason
        if first:
            logger.warning(reason)
        return self._unavailable or reason


class _Worker:
    """One child process and its pipes."""

    def __init__(self, executable: str, payload: bytes) -> None:
        flags = ["-P"] if sys.version_info >= (3, 11) else []  # not this folder on sys.path
        self.process = subprocess.Popen(
            [executable, *flags, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout: IO[bytes] = self.process.stdout
        try:
            _write_frame(self._stdin, payload)
        except OSError:
            self.kill()
            self.reap()
            raise

    def send(self, regex: str) -> None:
        with contextlib.suppress(OSError):  # it died; receive() reports it
            _write_frame(self._stdin, pickle.dumps(regex))

    def receive(self) -> tuple[str, Any]:
        reply = _read_frame(self._stdout)
        if reply is None:
            raise EOFError("the index worker exited")
        return reply

    def kill(self) -> None:
        """Signals the process only: the thread reading its answer reaps it (see reap)."""
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        """Closes its stdin, so it exits once idle; reaped on a thread of its own."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        threading.Thread(target=self.reap, name="index-worker-reap", daemon=True).start()

    def reap(self) -> None:
        """Waits for the process to end and closes its pipes."""
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for pipe in (self._stdin, self._stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def _write_frame(pipe: IO[bytes], data: bytes) -> None:
    pipe.write(_LENGTH.pack(len(data)) + data)
    pipe.flush()


def _read_frame(pipe: IO[bytes]) -> Any:
    """The next frame's object, or None at end of input."""
    header = pipe.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    data = pipe.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _exit_when_orphaned(parent: int) -> None:
    """Ends the process once its parent is gone (the build itself releases the GIL)."""
    import time

    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_S)
    os._exit(0)


def main() -> None:
    """The child: reads the vocabularies, then builds each regex it is sent until stdin ends."""
    from outlines_core import Index

    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints cannot corrupt a frame
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    vocabularies = _read_frame(requests)
    if vocabularies is None:
        return
    while (regex := _read_frame(requests)) is not None:
        try:
            reply: tuple[str, Any] = ("ok", [Index(regex, vocab) for vocab in vocabularies])
        except Exception as exc:  # outlines-core's refusal, passed on as the parent's error
            reply = ("error", str(exc))
        _write_frame(replies, pickle.dumps(reply))


if __name__ == "__main__":
    main()

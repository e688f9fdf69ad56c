"""A peer in its own process, so a peer that crashes (llama-cpp-python's `decode` segfaults on
some CPUs) costs its own rows, never the benchmark run.

`IsolatedPeer(name, options)` starts a worker process (spawned, not forked: the parent holds
torch threads) that builds the peer and then runs one workload method per request. A crash, at
start-up or in any method, turns into `Skipped` with the exit signal and the end of its stderr;
the report prints that as the row's reason. Results cross the pipe as plain data: W1's ChatRun
becomes its prompts and answers, all the W1 agreement check reads.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import Skipped, without_variables
from sgl_lite.backend import omp_policy

METHODS = ("w1", "w2", "w3", "w4")
START_TIMEOUT_S = 300.0


def _plain(result: dict[str, Any]) -> dict[str, Any]:
    run = result.get("_run")
    if run is not None:
        result = {**result, "_run": {"prompts": run.prompts, "answers": run.answers}}
    return result


def _build(name: str, options: dict[str, Any]) -> Any:
    if ":" in name:  # "module:function", a factory taking the options (tests use this)
        import importlib

        module, function = name.split(":")
        return getattr(importlib.import_module(module), function)(options)
    from bench import peers
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    folder = resolve_model_path(None)
    tokenizer = load_tokenizer(folder)
    if name == "llama_cpp":
        return peers.LlamaCpp(options["num_threads"], tokenizer)
    if name == "outlines":
        from bench.hf_baselines import load_hf_model

        return peers.Outlines(load_hf_model(folder), tokenizer)
    raise ValueError(f"unknown peer {name!r}")


def _worker(conn: Any, name: str, options: dict[str, Any], stderr_path: str) -> None:
    import os
    import sys

    # The peer's own C code writes to fd 2; keep it for the crash report.
    log = open(stderr_path, "w")  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    import torch

    torch.set_num_threads(options["num_threads"])
    from bench.workloads import build

    try:
        peer = _build(name, options)
        wl = build(**options["workloads"])
    except Skipped as exc:
        conn.send(("skipped", str(exc)))
        return
    except Exception as exc:
        traceback.print_exc()
        conn.send(("skipped", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", [m for m in ("warmup", *METHODS) if hasattr(peer, m)]))
    while True:
        method = conn.recv()
        if method is None:
            if hasattr(peer, "shutdown"):
                peer.shutdown()
            return
        try:
            result = peer.warmup() if method == "warmup" else _plain(getattr(peer, method)(wl))
            conn.send(("ok", result))
        except Skipped as exc:
            conn.send(("skipped", str(exc)))
        except Exception as exc:
            traceback.print_exc()
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def peer_marked() -> Iterator[None]:
    """Within the block, a child started here keeps libgomp's defaults, not sgl_lite's wait
    policy, even where it imports sgl_lite (for file paths) before torch."""
    os.environ[omp_policy.KEEP_DEFAULTS] = "1"
    try:
        yield
    finally:
        os.environ.pop(omp_policy.KEEP_DEFAULTS, None)


class IsolatedPeer:
    """A peer system run in a child process; exposes the peer's own w1..w4 and warmup."""

    def __init__(self, name: str, num_threads: int, workload_options: dict[str, Any]) -> None:
        self.name = name
        self._stderr = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        options = {"num_threads": num_threads, "workloads": workload_options}
        self._proc = ctx.Process(
            target=_worker, args=(child, name, options, str(self._stderr)), daemon=True
        )
        # The peer starts with the environment its users give it, not with the OpenMP wait
        # policy sgl_lite set for its own engine in this process (omp_policy).
        with without_variables(omp_policy.variables_set()), peer_marked():
            self._proc.start()
        child.close()
        self._dead: str | None = None
        kind, payload = self._receive("start-up", START_TIMEOUT_S)
        if kind != "ready":
            self.shutdown()
            raise Skipped(payload)
        self._methods = set(payload)

    def _crash_report(self, during: str) -> str:
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        tail = self._stderr.read_text(errors="replace").strip().splitlines()[-3:]
        return f"{self.name} crashed during {during} ({how})" + (
            f": {' | '.join(tail)}" if tail else ""
        )

    def _receive(self, during: str, timeout: float | None = None) -> tuple[str, Any]:
        try:
            if timeout is not None and not self._conn.poll(timeout):
                self._proc.kill()
                return "skipped", f"{self.name} did not answer within {timeout:.0f}s ({during})"
            return self._conn.recv()
        except (EOFError, ConnectionError, OSError):
            self._dead = self._crash_report(during)
            return "skipped", self._dead

    def _call(self, method: str) -> Any:
        if self._dead:
            raise Skipped(self._dead)
        try:
            self._conn.send(method)
        except (BrokenPipeError, OSError):
            self._dead = self._crash_report(method)
            raise Skipped(self._dead) from None
        kind, payload = self._receive(method)
        if kind == "ok":
            return payload
        if kind == "error":
            raise RuntimeError(payload)
        raise Skipped(payload)

    def __getattr__(self, method: str) -> Any:
        if method in METHODS and method in self.__dict__.get("_methods", ()):

            def run(wl: Any) -> dict[str, Any]:
                result = self._call(method)
                if "_run" in result:
                    result["_run"] = SimpleNamespace(**result["_run"])
                return result

            return run
        raise AttributeError(method)

    def warmup(self) -> None:
        """The peer's warm-up; a crash here marks the peer skipped for every workload."""
        if "warmup" in self._methods:
            with contextlib.suppress(Skipped):  # recorded in self._dead; each workload says so
                self._call("warmup")

    def shutdown(self) -> None:
        """Ends the worker (politely first)."""
        if self._proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(None)
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)

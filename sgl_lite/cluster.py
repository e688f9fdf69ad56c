"""`python -m sgl_lite.launch_server --dp N`: N single-replica workers behind sglang-router.

SGLang's `--dp N` runs N replicas behind one address. Here each replica is a worker process
(`launch_server` itself, on a free loopback port, with an equal share of the cores and of
`--mem-fraction-static`), and SGLang's own Rust router (`sglang-router`, the `cluster` extra)
listens on `--host`/`--port` with cache-aware routing. SIGTERM or SIGINT stops the router first,
then the workers (each drains its own requests), and the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

logger = logging.getLogger("sgl_lite.cluster")

# Flags the command sets per worker; everything else on the command line is passed on as is.
_PER_WORKER = {
    "--dp", "--dp-size", "--data-parallel-size", "--port", "--host",
    "--mem-fraction-static", "--num-threads",
}  # fmt: skip
# Drop a dead worker within seconds (health checks, a circuit breaker opening after 2 failures)
# and retry the requests that hit it meanwhile with backoff (tests/process/test_router.py).
ROUTER_FLAGS = (
    "--policy", "cache_aware",
    "--health-check-interval-secs", "2",
    "--health-failure-threshold", "2",
    "--retry-max-retries", "5",
    "--retry-initial-backoff-ms", "200",
    "--retry-max-backoff-ms", "2000",
    "--cb-failure-threshold", "2",
)  # fmt: skip


def worker_argv(argv: list[str], port: int, threads: int, fraction: float | None) -> list[str]:
    """The launch_server command line of one worker: `argv` without the per-worker flags."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _PER_WORKER:
            skip = "=" not in arg  # `--port 1` takes the next item too; `--port=1` does not
            continue
        out.append(arg)
    out += ["--host", "127.0.0.1", "--port", str(port), "--num-threads", str(threads)]
    if fraction is not None:
        out += ["--mem-fraction-static", f"{fraction:.6f}"]
    return [sys.executable, "-m", "sgl_lite.launch_server", *out]


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_healthy(url: str) -> bool:
    """Whether `GET {url}/health` answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def stop_all(procs: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM to each process still running; SIGKILL to any not gone within `timeout` s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_cluster(args: argparse.Namespace, argv: list[str]) -> int:
    """Starts `args.dp_size` workers and the router, supervises them until a signal; exit code."""
    dp = args.dp_size
    threads = args.num_threads or max(1, (os.cpu_count() or 1) // dp)
    fraction = args.mem_fraction_static / dp if args.mem_fraction_static else None
    ports = [free_port() for _ in range(dp)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    workers = [subprocess.Popen(worker_argv(argv, p, threads, fraction)) for p in ports]
    router: subprocess.Popen | None = None
    try:
        logger.info("starting %d workers (%d threads each) at %s", dp, threads, " ".join(urls))
        while not all(is_healthy(u) for u in urls):
            dead = [u for u, w in zip(urls, workers) if w.poll() is not None]
            if dead:
                logger.error("worker(s) %s exited before serving", " ".join(dead))
                return 1
            if stopping:
                return 0
            time.sleep(0.5)
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", args.host]
        cmd += ["--port", str(args.port), "--worker-urls", *urls, *ROUTER_FLAGS]
        # NOTE: the router's own metrics default to port 29000; a free one lets several
        # clusters (or a test run beside another) share a machine
        cmd += ["--prometheus-port", str(free_port())]
        if args.api_key:
            cmd += ["--api-key", args.api_key]
        router = subprocess.Popen(cmd)
        logger.info("router on http://%s:%d in front of %d workers", args.host, args.port, dp)
        while not stopping and router.poll() is None:
            time.sleep(0.2)
        return 0 if stopping else (router.returncode or 1)
    finally:
        # The router first, so nothing new reaches a worker that is draining.
        stop_all([router] if router is not None else [], timeout=10)
        stop_all(workers, timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

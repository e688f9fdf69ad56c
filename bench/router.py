"""W1 through sglang-router: cache-aware vs round-robin routing, N workers x T threads.

    python -m bench.router --workers 2 --threads 1 --policy cache_aware
    python -m bench.router --workers 2 --threads 1 --policy round_robin
    python -m bench.router --workers 1 --threads 2 --policy none     # one server, no router
    python -m bench.router --router-args "--balance-abs-threshold 2 --balance-rel-threshold 1.2"

Starts the workers (`launch_server`) and the router on loopback, then runs W1 over HTTP: turn t
of all 8 conversations at once (in a shuffled order, as users arrive), then turn t + 1. Prints
one JSON line: wall time, prompt tokens submitted and cached (from each answer's meta_info),
hit rate, and how many prompts each worker got.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from bench.common import ChatRun
from bench.workloads import build
from sgl_lite.cluster import free_port, is_healthy, stop_all


@contextlib.contextmanager
def cluster(
    workers: int, threads: int, policy: str, router_args: list[str]
) -> Iterator[tuple[str, list[str]]]:
    """The workers (and the router unless policy is 'none'); yields (entry URL, worker URLs)."""
    procs: list[subprocess.Popen] = []
    ports = [free_port() for _ in range(workers)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for port in ports:
            cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--port", str(port)]
            cmd += ["--num-threads", str(threads), "--log-level", "warning"]
            procs.append(subprocess.Popen(cmd))
        while not all(is_healthy(u) for u in urls):
            if any(p.poll() is not None for p in procs):
                raise SystemExit("a worker exited before serving")
            time.sleep(0.5)
        entry = urls[0]
        if policy != "none":
            port = free_port()
            cmd = [sys.executable, "-m", "sglang_router.launch_router", "--port", str(port)]
            cmd += ["--worker-urls", *urls, "--policy", policy, "--log-level", "warn"]
            cmd += ["--prometheus-port", str(free_port())]  # not the shared default (29000)
            cmd += router_args
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
            entry = f"http://127.0.0.1:{port}"
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{entry}/v1/models", timeout=2).status_code == 200:
                        break
                time.sleep(0.25)
        yield entry, urls
    finally:
        stop_all(procs[::-1], timeout=30)


def run_w1(entry: str, tokenizer, seed: int = 0) -> dict:
    """W1 over HTTP through `entry`; the figures of one run."""
    wl = build()
    chat = ChatRun(tokenizer, wl)
    rng = random.Random(seed)
    cached = submitted = 0
    client = httpx.Client(timeout=600)

    def turn(conv: int) -> tuple[int, dict]:
        ids = chat.prompt(conv)
        params = {"temperature": 0, "max_new_tokens": wl.chat_max_new_tokens}
        out = client.post(f"{entry}/generate", json={"input_ids": ids, "sampling_params": params})
        out.raise_for_status()
        return conv, out.json()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(wl.conversations)) as pool:
        for _ in range(chat.num_turns):
            order = list(range(len(wl.conversations)))
            rng.shuffle(order)
            for conv, out in pool.map(turn, order):
                meta = out["meta_info"]
                chat.record(conv, out["output_ids"], meta["e2e_latency"])
                cached += meta["cached_tokens"]
                submitted += meta["prompt_tokens"]
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 2), "prompt_tokens": submitted, "cached_tokens": cached,
            "hit_rate": round(cached / submitted, 3)}  # fmt: skip


def main() -> None:
    """Parses the flags, runs W1 once, prints its figures as one JSON line."""
    parser = argparse.ArgumentParser(description="W1 through sglang-router")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--policy", default="cache_aware", choices=["cache_aware", "round_robin", "none"]
    )
    parser.add_argument(
        "--router-args", default="", help="more router flags, e.g. '--balance-abs-threshold 2'"
    )
    args = parser.parse_args()
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(None))
    # A timeout's SIGTERM unwinds like ^C, so the workers and the router are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    router_args = args.router_args.split()
    with cluster(args.workers, args.threads, args.policy, router_args) as (entry, urls):
        figures = run_w1(entry, tokenizer)
        per_worker = [
            httpx.get(f"{u}/get_server_info", timeout=30).json()["prompt_tokens_submitted"]
            for u in urls
        ]
    print(json.dumps({**vars(args), **figures, "prompt_tokens_per_worker": per_worker}))


if __name__ == "__main__":
    main()

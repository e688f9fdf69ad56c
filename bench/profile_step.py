"""`python -m bench.profile_step`: where a forward pass's time goes, by batch size and path.

On the in-process `Engine`'s runner (the embedded model unless --model-path), for each decode
batch size: B requests of `--context` random tokens are prefilled, then decode steps of one new
token each are timed (median of the steady steps). Where the fast mode has an onnxruntime decode
step, each size is timed on both paths in one process, interleaved (the graph in one run; the
torch step with the dense weights; and, where the runner runs larger batches on the graph in
groups, those groups), so the figures see the same machine. Prefill passes of T tokens
follow. `--ops N` adds torch's profiler table (the N ops with the most self time) for the torch
step at each size: GEMMs (`mkldnn::_linear_pointwise`, `aten::mm`, the int kernels), attention
(`aten::_scaled_dot_product_*`), gathers of the pool (`aten::index_select`), norms and
elementwise work.

Timings are wall time on the calling thread with `--threads` threads: run it alone on a quiet
machine; a busy one slows every OpenMP op many times over.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from sgl_lite.backend.types import Segment


def _prefill(runner: Any, batch: int, context: int, extra: int) -> list[torch.Tensor]:
    """B prefilled requests of `context` tokens; their slots hold `extra` more."""
    slots_of = []
    for b in range(batch):
        ids = [(7 * b + 13 * i) % 40000 + 100 for i in range(context)]
        slots = runner.pool.alloc(context + extra)
        if slots is None:
            raise SystemExit(f"the pool cannot hold {batch} x {context + extra} tokens")
        runner.forward(
            [Segment(token_ids=ids, start=0, kv_slots=slots[:context], logits_from=context)]
        )
        slots_of.append(slots)
    return slots_of


def _steps(runner: Any, slots_of: list[torch.Tensor], context: int, steps: int) -> list[float]:
    times = []
    for k in range(steps):
        segments = [
            Segment(
                token_ids=[500 + b],
                start=context + k,
                kv_slots=slots[: context + k + 1],
                logits_from=0,
            )
            for b, slots in enumerate(slots_of)
        ]
        started = time.perf_counter()
        runner.forward(segments)
        times.append(time.perf_counter() - started)
    return times


def decode_ms(runner: Any, batch: int, context: int, steps: int = 10) -> float:
    """Median milliseconds of a steady decode step of `batch` rows at `context` tokens."""
    slots_of = _prefill(runner, batch, context, steps)
    try:
        return 1e3 * statistics.median(_steps(runner, slots_of, context, steps)[2:])
    finally:
        for slots in slots_of:
            runner.pool.free(slots)


def op_table(runner: Any, batch: int, context: int, rows: int) -> str:
    """torch's profiler table of five decode steps of `batch` rows."""
    from torch.profiler import ProfilerActivity, profile

    slots_of = _prefill(runner, batch, context, 10)
    try:
        _steps(runner, slots_of, context, 3)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _steps(runner, slots_of, context + 3, 5)
    finally:
        for slots in slots_of:
            runner.pool.free(slots)
    return prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=44
    )


def prefill_ms(runner: Any, tokens: int, repeats: int = 3) -> float:
    """Fastest milliseconds of a `tokens`-token prefill from an empty sequence."""
    best = float("inf")
    for k in range(repeats):
        ids = [(13 * i + k) % 40000 + 100 for i in range(tokens)]
        slots = runner.pool.alloc(tokens)
        started = time.perf_counter()
        runner.forward([Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=tokens - 1)])
        best = min(best, time.perf_counter() - started)
        runner.pool.free(slots)
    return 1e3 * best


def _route(step: Any, path: str, batch: int, graph_rows: int, groups: bool) -> None:
    """Sends a decode batch down `path`: "graph" (one run of all rows), "groups" (runs of
    `graph_rows`), "torch", or "default" (the runner's own choice)."""
    if not graph_rows:
        return
    step.max_rows = (
        max(batch, graph_rows) if path == "graph" else 0 if path == "torch" else graph_rows
    )
    step.decode_groups = groups if path == "default" else path == "groups"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--prefill", default="64,512,2048")
    parser.add_argument("--ops", type=int, default=0, help="profiler rows per batch size")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sgl_lite.backend.engine import Engine

    engine = Engine(
        model_path=args.model_path,
        num_threads=args.threads,
        max_total_tokens=16384,
        log_level="warning",
    )
    runner = engine.runner
    print(runner.format.describe())
    step = runner.decode_step
    graph_rows = step.max_rows if step is not None and not step.every_pass else 0
    groups = bool(graph_rows) and step is not None and step.decode_groups
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            figures = []
            paths = ("graph", "torch") if graph_rows else ("torch",)
            if groups and batch > graph_rows:
                paths = ("graph", "groups", "torch")
            times: dict[str, list[float]] = {path: [] for path in paths}
            for _ in range(2):
                for path in paths:
                    _route(step, path, batch, graph_rows, groups)
                    times[path].append(decode_ms(runner, batch, args.context))
            _route(step, "default", batch, graph_rows, groups)
            for path in paths:
                ms = min(times[path])
                figures.append(f"{path} {ms:7.2f} ms ({1e3 * batch / ms:6.1f} tok/s)")
            taken = "graph" if batch <= graph_rows else "groups" if groups else "torch"
            print(f"decode B={batch:3d}: " + "  ".join(figures) + f"  [default: {taken}]")
            if args.ops:
                _route(step, "torch", batch, graph_rows, groups)
                print(op_table(runner, batch, args.context, args.ops))
                _route(step, "default", batch, graph_rows, groups)
        for tokens in [int(t) for t in args.prefill.split(",") if t]:
            ms = prefill_ms(runner, tokens)
            print(f"prefill T={tokens:5d}: {ms:8.1f} ms ({1e3 * tokens / ms:7.1f} tok/s)")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

"""`python -m bench.constrained_throughput`: constrained vs unconstrained tokens/s, N in flight.

Issue 37's target: N (default 32) constrained requests in flight decode at >= 0.8x the
aggregate tokens/s of the same requests unconstrained with the same output lengths, the closer
included. On the in-process `Engine` (the embedded model unless --model-path):

- (a) constrained: the N prompts with `json_schema` (W3's product extraction, or with
  `--workload jsb` the largest JSONSchemaBench sample schemas the backend compiles);
- (b) unconstrained: the same N prompts, each with `max_new_tokens` set to the output length
  (a) gave that request and `ignore_eos`, so both arms produce the same tokens per request.

Aggregate tokens/s = all output tokens / the wall time from submitting the N requests to the
last one finishing; beside it, tokens per CPU-second of the process (all its threads), which a
shared machine's preemption moves less. The arms alternate in one process (A B, then B A, ...:
B takes the lengths of an A run just before it), after a warm-up that compiles the grammars
and puts the prompts in the radix cache. On a shared machine the absolute figures move with
the load; the per-round ratio, taken seconds apart, moves less: read its median. Each run also
gives its forward passes, how many the runner's onnxruntime decode graph took (the rest ran on
the torch path), and the medians of its full-batch decode steps (constrained_overhead.summarize:
forward, masks on the worker, the loop thread's wait for them, mask apply, the guide calls after
sampling). `--jump-forward both` runs a pair with the constrained arm's jump-forward on and one
with it off each round (`OutputProcessor.jump_forward`, switched between runs).

`--profile PATH` adds one more constrained run under cProfile, of the engine's loop thread
(each `Engine.step`) and of the mask worker (each `compute_masks`), and writes the two tables
(top entries by cumulative time) there. cProfile's own cost lands on Python-heavy code (the
guide calls, the scheduler) and not on the forward's kernels, so it overstates the former.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.constrained_overhead import StepClock, instrument, patched, pick_schemas, prompt_ids
from bench.constrained_overhead import summarize as step_summary

GRAPH_PASSES = {"n": 0}  # forward passes the runner's onnxruntime decode step took (this run)
STEP_KEYS = ("step_ms", "forward_ms", "masks_worker_ms", "mask_wait_ms", "mask_apply_ms")


def w3_requests(tokenizer: Any, n: int) -> tuple[list[list[int]], list[str]]:
    """N W3 prompts (the products in turn) and the W3 schema for each."""
    from bench.common import json_prompt_ids
    from bench.workloads import build

    wl = build()
    schema = json.dumps(wl.json_schema)
    prompts = [json_prompt_ids(tokenizer, wl, wl.products[i % len(wl.products)]) for i in range(n)]
    return prompts, [schema] * n


def jsb_requests(
    tokenizer: Any, n: int, backend: str, max_new_tokens: int
) -> tuple[list[list[int]], list[str]]:
    """N copies of constrained_overhead's shared prompt over its 8 largest compiling schemas."""
    paths = pick_schemas(tokenizer, backend, 8, 10.0, max_new_tokens)
    texts = [p.read_text(encoding="utf-8") for p in paths]
    ids = prompt_ids(tokenizer)
    return [ids] * n, [texts[i % len(texts)] for i in range(n)]


def ab_pair(
    engine: Any,
    clock: StepClock,
    prompts: list[list[int]],
    schemas: list[str],
    budget: int,
    temperature: float,
    *,
    first: bool,
) -> dict[str, Any]:
    """(a) constrained, then (b) unconstrained with (a)'s lengths; `first=False` runs (b)
    first, with the lengths of one more constrained run made just before (not timed)."""
    n = len(prompts)
    pair: dict[str, Any] = {}
    if first:
        pair["constrained"] = run_arm(engine, clock, prompts, schemas, [budget] * n, temperature)
        lengths = pair["constrained"]["tokens"]
        pair["free"] = run_arm(engine, clock, prompts, None, lengths, temperature)
    else:
        lengths = run_arm(engine, clock, prompts, schemas, [budget] * n, temperature)["tokens"]
        pair["free"] = run_arm(engine, clock, prompts, None, lengths, temperature)
        pair["constrained"] = run_arm(engine, clock, prompts, schemas, [budget] * n, temperature)
    pair["length_mismatches"] = sum(a != b for a, b in zip(pair["free"]["tokens"], lengths))
    c, f = pair["constrained"], pair["free"]
    pair["ratio"] = round(c["tokens_per_s"] / f["tokens_per_s"], 3)
    pair["cpu_ratio"] = round(c["tokens_per_cpu_s"] / f["tokens_per_cpu_s"], 3)
    return pair


def run_arm(
    engine: Any,
    clock: StepClock,
    prompts: list[list[int]],
    schemas: list[str] | None,
    lengths: list[int],
    temperature: float,
) -> dict[str, Any]:
    """One run of all the requests together: constrained when `schemas` is given (each with
    `max_new_tokens` = lengths[i]), else unconstrained with exactly lengths[i] tokens. No
    request sets a seed: the rows draw together from the sampler's generator (a seeded
    request draws alone, a per-row cost both arms would pay, which would hide the gap)."""
    requests = []
    for i, ids in enumerate(prompts):
        params: dict[str, Any] = {
            "temperature": temperature,
            "max_new_tokens": lengths[i],
        }
        if schemas is not None:
            params["json_schema"] = schemas[i]
        else:
            params["ignore_eos"] = True
        requests.append({"input_ids": ids, "sampling_params": params})
    clock.steps.clear()
    clock.take()
    GRAPH_PASSES["n"] = 0
    start, cpu = time.perf_counter(), time.process_time()
    results = asyncio.run(_gather(engine, requests))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = [int(r["meta_info"]["completion_tokens"]) for r in results]
    steps = step_summary(clock.steps, len(prompts))
    return {
        "wall_s": round(wall, 3),
        "tokens": tokens,
        "tokens_per_s": round(sum(tokens) / wall, 1),
        "cpu_s": round(cpu, 3),
        "tokens_per_cpu_s": round(sum(tokens) / max(cpu, 1e-6), 1),
        "forward_passes": len(clock.steps),
        "graph_passes": GRAPH_PASSES["n"],
        "violations": sum(bool(r["meta_info"].get("constraint_violation")) for r in results),
        "aborted": sum(
            (r["meta_info"].get("finish_reason") or {}).get("type") == "abort" for r in results
        ),
        **{k: steps.get(k) for k in ("steps", *STEP_KEYS, "guide_loop_ms")},
    }


async def _gather(engine: Any, requests: list[dict[str, Any]]) -> list[Any]:
    return list(await asyncio.gather(*(engine.async_generate(**r) for r in requests)))


def count_graph_passes(engine: Any) -> list[Any]:
    """A context manager (none where the runner has no onnxruntime decode step) that counts
    in GRAPH_PASSES the passes the graph took; every other pass ran on the torch path (a
    batch with a prefill or a jump-forward's extension, the runner's `_forward_pass`)."""
    step = getattr(engine.runner, "decode_step", None)
    if step is None:
        return []
    run = step.run

    @functools.wraps(run)
    def counted(*args: Any, **kwargs: Any) -> Any:
        out = run(*args, **kwargs)
        GRAPH_PASSES["n"] += out is not None
        return out

    return [patched(step, "run", counted)]


def profiled(fn: Callable[..., Any], prof: cProfile.Profile) -> Callable[..., Any]:
    """`fn` with `prof` enabled around each call (cProfile profiles the calling thread only)."""

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        prof.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            prof.disable()

    return inner


def profile_run(engine: Any, run: Callable[[], Any], rows: int) -> str:
    """Runs `run` with the loop thread's steps and the mask worker's calls under cProfile;
    the two tables, top `rows` entries by cumulative time."""
    from sgl_lite.backend.scheduler import mask_prefetch

    loop, worker = cProfile.Profile(), cProfile.Profile()
    with (
        patched(engine, "step", profiled(engine.step, loop)),
        patched(mask_prefetch, "compute_masks", profiled(mask_prefetch.compute_masks, worker)),
    ):
        run()
    out = []
    for name, prof in (
        ("loop thread (Engine.step)", loop),
        ("mask worker (compute_masks)", worker),
    ):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(rows)
        out.append(f"## {name}\n{buf.getvalue()}")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.constrained_throughput", description=__doc__)
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--rounds", type=int, default=4, help="A/B pairs")
    p.add_argument("--workload", choices=("w3", "jsb"), default="w3")
    p.add_argument("--backend", default="auto", help="EngineConfig.grammar_backend")
    p.add_argument("--max-new-tokens", type=int, help="the constrained budget (W3: 64, jsb: 96)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--no-overlap", action="store_true", help="masks on the loop thread")
    p.add_argument(
        "--jump-forward",
        choices=("on", "off", "both"),
        default="on",
        help="the constrained runs' jump-forward (both: a pair of each per round)",
    )
    p.add_argument("--model-path", help="default: the embedded SmolLM2")
    p.add_argument("--profile", help="write the cProfile tables of one more constrained run here")
    p.add_argument("--profile-rows", type=int, default=40)
    p.add_argument("--out", help="write the result as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sgl_lite.backend.engine import Engine

    args = parse_args(argv)
    n = args.concurrency
    budget = args.max_new_tokens or (64 if args.workload == "w3" else 96)
    engine = Engine(
        args.model_path,
        num_threads=args.num_threads,
        grammar_backend=args.backend,
        max_running_requests=n,
        overlap_masks=not args.no_overlap,
        log_level="warning",
    )
    clock = StepClock()
    result: dict[str, Any] = {"args": vars(args), "load": os.getloadavg(), "rounds": []}
    try:
        if args.workload == "w3":
            prompts, schemas = w3_requests(engine.tokenizer, n)
        else:
            prompts, schemas = jsb_requests(engine.tokenizer, n, args.backend, budget)
        cms = [*instrument(engine, clock), *count_graph_passes(engine)]
        for cm in cms:
            cm.__enter__()
        try:
            temp = args.temperature

            def constrained() -> dict[str, Any]:
                return run_arm(engine, clock, prompts, schemas, [budget] * n, temp)

            variants = {"on": [True], "off": [False], "both": [True, False]}[args.jump_forward]
            engine.outputs.jump_forward = variants[0]
            constrained()  # the warm-up: grammars compiled, prompts cached
            for r in range(args.rounds):
                for jf in variants if r % 2 == 0 else variants[::-1]:
                    engine.outputs.jump_forward = jf
                    pair = ab_pair(engine, clock, prompts, schemas, budget, temp, first=r % 2 == 0)
                    pair["jump_forward"] = jf
                    result["rounds"].append(pair)
                    print(
                        f"round {r} jump-forward {'on' if jf else 'off'}: {brief(pair)}", flush=True
                    )
            engine.outputs.jump_forward = variants[0]
            if args.profile:
                Path(args.profile).write_text(
                    profile_run(engine, constrained, args.profile_rows), encoding="utf-8"
                )
                print(f"wrote {args.profile}")
        finally:
            for cm in reversed(cms):
                cm.__exit__(None, None, None)
    finally:
        engine.shutdown()
    result["load_after"] = os.getloadavg()
    result["ratio_median"] = {}
    for jf in (True, False):
        pairs = [p for p in result["rounds"] if p["jump_forward"] is jf]
        if pairs:
            name = f"jump-forward {'on' if jf else 'off'}"
            wall = [p["ratio"] for p in pairs]
            cpu = [p["cpu_ratio"] for p in pairs]
            result["ratio_median"][name] = statistics.median(wall)
            result["ratio_median"][f"{name}, CPU time"] = statistics.median(cpu)
            print(
                f"constrained / unconstrained tokens/s at {n} in flight, {name}: median "
                f"{statistics.median(wall)} over {wall}; per CPU-second {statistics.median(cpu)} "
                f"over {cpu}"
            )
    print(f"load {result['load']} -> {result['load_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")
    return result


def brief(pair: dict[str, Any]) -> str:
    """One line: each arm's tokens, tokens/s and step medians, and the ratio."""
    parts = []
    for arm in ("constrained", "free"):
        a = pair[arm]
        steps = " ".join(f"{k[:-3]}={a[k]}" for k in STEP_KEYS if a.get(k) is not None)
        parts.append(
            f"{arm}: {sum(a['tokens'])} tok in {a['wall_s']} s = {a['tokens_per_s']} tok/s, "
            f"{a['tokens_per_cpu_s']} tok/CPU-s "
            f"({a['forward_passes']} passes, {a['graph_passes']} on the graph, violations "
            f"{a['violations']}, aborted {a['aborted']}; medians ms {steps})"
        )
    tail = f"length mismatches {pair['length_mismatches']} | ratio {pair['ratio']}"
    tail += f" (CPU time: {pair['cpu_ratio']})"
    return f"{' | '.join(parts)} | {tail}"


if __name__ == "__main__":
    main()

"""`python -m bench.constrained_overhead`: a decode step's constraint work against its forward.

On the in-process `Engine` (the embedded model unless --model-path), batches of 1, 16 and 64
JSON-schema requests built from the largest schemas of the JSONSchemaBench sample that the
backend compiles, then the same requests unconstrained. Each step is timed by wrapping the
engine's own objects from outside (nothing in sgl_lite is changed; the wrappers cost about a
microsecond a call):

- forward: `runner.forward`;
- masks (worker): `mask_prefetch.compute_masks`, which runs on the prefetch worker beside the
  forward; `mask wait`: what `PendingMasks.wait()` still blocks the loop thread for after the
  forward returned (the masks' exposed part);
- mask apply: `Sampler._apply_penalties_and_masks` (no penalties are set, so the grammar masks'
  `torch.where`; its unconstrained figure is the baseline);
- guide (loop): the guide calls `OutputProcessor` makes after sampling (`budget_substitute`:
  the budget closer, `advance`, `is_finished`, jump-forward with its retokenization), outermost
  calls only;
- step: `Engine.step` whole.

Only steady decode steps count: every request of the step past its prompt (a jump-forward's
short extension included) and at least 90 % of the batch still running (prefill and the tail
where requests have finished are left out). The figures are medians over those steps, in
milliseconds, and the ratios are to the same step's forward. The overhead on the loop thread's
critical path (`overhead_ms`) = mask submit + mask wait + mask apply (less the unconstrained
run's submit and apply) + the guide calls. The worker's mask time overlaps the forward; on a
machine with fewer free cores than threads it competes with it for CPU, so it is reported too.
Each wrapped call also records its thread's CPU time (`time.thread_time`): on a loaded machine
wall times include preemption, so the CPU-time ratio of (mask apply + guide calls) to the
forward (one OpenMP thread: the loop thread does the forward's work) is the steadier figure.

Prompts are short and shared (the radix cache keeps one copy), so prefill stays small at 64.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.jsonschemabench import DATA, SYSTEM_PROMPT, declare, new_compiler

GUIDE_CALLS = ("budget_substitute", "advance", "is_finished", "allowed_mask", "meta_info")
VIOLATION_KEYS = ("constraint_violation", "budget_closed", "budget_cut", "completion_tokens")
PROMPT = "Write one realistic example instance of the schema as compact JSON."


class StepClock:
    """Per-thread time in the wrapped calls (outermost only) and per-step records."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.lock = threading.Lock()
        self.totals: dict[str, float] = defaultdict(float)  # since the current step began
        self.steps: list[dict[str, Any]] = []

    def wrap(self, name: str, fn: Callable[..., Any], *, leaf: bool = True) -> Any:
        """`fn` timed under `name`. A leaf call made inside another leaf call on the same
        thread is not counted again; a container (`leaf=False`: the forward, the sampler)
        is timed whole and leaves the leaf calls inside it counted under their own names."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            if leaf and depth:
                return fn(*args, **kwargs)
            if leaf:
                self._local.depth = depth + 1
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
                self._local.depth = depth
                with self.lock:
                    self.totals[name] += seconds
                    self.totals[f"{name}_cpu"] += cpu

        return timed

    def take(self) -> dict[str, float]:
        """The totals since the last take, reset."""
        with self.lock:
            out = dict(self.totals)
            self.totals.clear()
        return out


@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Sets `obj.name` to `value` for the block."""
    saved = obj.__dict__.get(name, None) if isinstance(obj, type) else getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if saved is None and isinstance(obj, type):
            delattr(obj, name)
        else:
            setattr(obj, name, saved)


def instrument(engine: Any, clock: StepClock) -> list[Any]:
    """Context managers that time the engine's step parts (see the module docstring)."""
    from sgl_lite.backend.constrained.automaton.guide import AutomatonGuide
    from sgl_lite.backend.constrained.matchers.llguidance_backend import LLGuide
    from sgl_lite.backend.constrained.matchers.xgrammar_backend import XGGuide
    from sgl_lite.backend.scheduler import mask_prefetch
    from sgl_lite.backend.scheduler.output_processor import OutputProcessor
    from sgl_lite.backend.scheduler.sampler import Sampler

    step = engine.step

    def timed_step() -> Any:
        batch_box: dict[str, Any] = {}
        decoding = False
        schedule = engine.scheduler.schedule

        def spy() -> Any:
            nonlocal decoding
            start = time.perf_counter()
            batch = schedule()
            # every request past its prompt: single tokens, or a jump-forward's short extension
            decoding = batch is not None and all(r.output_ids for r in batch.reqs)
            with clock.lock:
                clock.totals["schedule"] += time.perf_counter() - start
            batch_box["batch"] = batch
            return batch

        engine.scheduler.schedule = spy
        start = time.perf_counter()
        try:
            return step()
        finally:
            seconds = time.perf_counter() - start
            del engine.scheduler.schedule
            parts = clock.take()
            batch = batch_box.get("batch")
            if batch is not None:
                clock.steps.append(
                    {
                        "n": len(batch.reqs),
                        "decode": decoding,
                        "step": seconds,
                        **parts,
                    }
                )

    cms = [
        patched(engine, "step", timed_step),
        patched(engine.runner, "forward", clock.wrap("forward", engine.runner.forward, leaf=False)),
        patched(engine.masks, "start", clock.wrap("mask_start", engine.masks.start, leaf=False)),
        patched(engine.sampler, "sample", clock.wrap("sample", engine.sampler.sample, leaf=False)),
        patched(
            engine.scheduler, "process", clock.wrap("process", engine.scheduler.process, leaf=False)
        ),
        patched(
            mask_prefetch, "compute_masks", clock.wrap("masks_worker", mask_prefetch.compute_masks)
        ),
        patched(
            mask_prefetch.PendingMasks,
            "wait",
            clock.wrap("mask_wait", mask_prefetch.PendingMasks.wait, leaf=False),
        ),
        patched(
            Sampler,
            "_apply_penalties_and_masks",
            clock.wrap("mask_apply", Sampler._apply_penalties_and_masks),
        ),
        patched(
            OutputProcessor,
            "_jump_forward",
            clock.wrap("guide_loop", OutputProcessor._jump_forward),
        ),
    ]
    for cls in (AutomatonGuide, LLGuide, XGGuide):  # each shadows what it inherits
        for name in GUIDE_CALLS:
            label = "masks_worker" if name == "allowed_mask" else "guide_loop"
            if name == "meta_info":
                label = "final_check"
            cms.append(patched(cls, name, clock.wrap(label, getattr(cls, name))))
    return cms


def pick_schemas(
    tokenizer: Any, backend: str, count: int, timeout_s: float, max_new_tokens: int
) -> list[Path]:
    """The `count` largest sample schemas (by file size) that `backend` compiles in time and
    whose shortest output is known and fits `max_new_tokens` (so every output can finish)."""
    compiler = new_compiler(tokenizer, backend, timeout_s)
    picked = []
    for path in sorted(DATA.glob("*/*.json"), key=lambda p: -p.stat().st_size):
        text = path.read_text(encoding="utf-8")
        decl = declare(compiler, text)
        why = decl.reason
        low = compiler.compile("json_schema", text).min_tokens if decl.ok else 0
        if decl.ok and not 0 < low <= max_new_tokens:
            # 0: the closer found no completion within its cap (no budget guarantee)
            why = f"shortest output {low or 'over 256'} tokens, budget {max_new_tokens}"
        print(f"  {path.parent.name}/{path.name}: {why or 'ok'} ({decl.seconds:.2f} s)", flush=True)
        if why is None:
            picked.append(path)
        if len(picked) == count:
            break
    return picked


def prompt_ids(tokenizer: Any) -> list[int]:
    """The one short prompt every request shares."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": PROMPT},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


async def _run_all(engine: Any, requests: list[dict[str, Any]]) -> list[Any]:
    return list(await asyncio.gather(*(engine.async_generate(**r) for r in requests)))


def summarize(steps: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Medians (ms) over the steady decode steps (see the module docstring), and each part's
    ratio to the forward."""
    full = [s for s in steps if s["decode"] and s["n"] >= math.ceil(0.9 * n)]
    for s in full:
        parts = ("schedule", "mask_start", "forward", "mask_wait", "sample", "process")
        s["rest"] = s["step"] - sum(s.get(k, 0.0) for k in parts)
    keys = ("step", "forward", "sample", "process", "schedule", "mask_start", "rest")
    parts = ("masks_worker", "mask_wait", "mask_apply", "guide_loop", "final_check")
    cpu = tuple(f"{k}_cpu" for k in ("forward", "masks_worker", "mask_apply", "guide_loop"))
    out: dict[str, Any] = {"steps": len(full)}
    for key in keys + parts + cpu:
        values = [s.get(key, 0.0) * 1e3 for s in full]
        out[f"{key}_ms"] = round(statistics.median(values), 3) if values else None
    for key in parts:
        ratios = [s.get(key, 0.0) / s["forward"] for s in full if s.get("forward")]
        out[f"{key}_ratio"] = round(statistics.median(ratios), 4) if ratios else None
    # the same on CPU time (each thread's own), which a loaded machine's preemption leaves out
    ratios = [
        (s.get("mask_apply_cpu", 0.0) + s.get("guide_loop_cpu", 0.0)) / s["forward_cpu"]
        for s in full
        if s.get("forward_cpu")
    ]
    out["apply_and_guide_cpu_ratio"] = round(statistics.median(ratios), 4) if ratios else None
    return out


def measure(engine: Any, requests: list[dict[str, Any]], clock: StepClock) -> dict[str, Any]:
    """Runs `requests` together; the summary over the full-batch decode steps."""
    clock.steps.clear()
    clock.take()
    start = time.perf_counter()
    results = asyncio.run(_run_all(engine, requests))
    wall = time.perf_counter() - start
    summary = summarize(clock.steps, len(requests))
    tokens = [r["meta_info"]["completion_tokens"] for r in results]
    violations = [
        {"text": r["text"][-200:], **{k: r["meta_info"].get(k) for k in VIOLATION_KEYS}}
        for r in results
        if r["meta_info"].get("constraint_violation")
    ]
    return {
        **summary,
        "wall_s": round(wall, 2),
        "completion_tokens_mean": round(statistics.mean(tokens), 1),
        "violations": len(violations),
        "violation_examples": violations[:5],
        "final_check_ms_total": round(sum(s.get("final_check", 0.0) for s in clock.steps) * 1e3, 2),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.constrained_overhead", description=__doc__)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--backend", default="auto", help="EngineConfig.grammar_backend")
    p.add_argument("--schemas", type=int, default=8, help="how many of the largest schemas")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--compile-timeout", type=float, default=10.0)
    p.add_argument("--no-overlap", action="store_true", help="masks on the loop thread")
    p.add_argument("--model-path", help="default: the embedded SmolLM2")
    p.add_argument("--out", help="write the result as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sgl_lite.backend.engine import Engine

    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    engine = Engine(
        args.model_path,
        num_threads=args.num_threads,
        grammar_backend=args.backend,
        grammar_compile_timeout=args.compile_timeout,
        max_running_requests=max(batches),
        overlap_masks=not args.no_overlap,
        log_level="warning",
    )
    clock = StepClock()
    result: dict[str, Any] = {"args": vars(args), "load": os.getloadavg(), "runs": {}}
    try:
        print(f"picking the {args.schemas} largest schemas {args.backend} compiles", flush=True)
        schemas = pick_schemas(
            engine.tokenizer, args.backend, args.schemas, args.compile_timeout, args.max_new_tokens
        )
        result["schemas"] = [f"{p.parent.name}/{p.name}" for p in schemas]
        ids = prompt_ids(engine.tokenizer)
        texts = [p.read_text(encoding="utf-8") for p in schemas]
        cms = instrument(engine, clock)
        for cm in cms:
            cm.__enter__()
        try:
            # a warm-up: every grammar compiled and cached, the prompt in the radix cache
            warm = [{"json_schema": t} for t in texts]
            asyncio.run(
                _run_all(
                    engine,
                    [
                        {
                            "input_ids": ids,
                            "sampling_params": {
                                "temperature": 0,
                                "max_new_tokens": args.max_new_tokens,
                                **w,
                            },
                        }
                        for w in warm
                    ],
                )
            )
            for n in batches:
                for kind in ("json_schema", "none"):
                    requests = []
                    for i in range(n):
                        params: dict[str, Any] = {
                            "temperature": 0.8,
                            "sampling_seed": i,
                            "max_new_tokens": args.max_new_tokens,
                        }
                        if kind == "json_schema":
                            params["json_schema"] = texts[i % len(texts)]
                        else:
                            params["ignore_eos"] = True
                        requests.append({"input_ids": ids, "sampling_params": params})
                    got = measure(engine, requests, clock)
                    result["runs"][f"{kind}@{n}"] = got
                    print(f"batch {n:>3} {kind:<11} {json.dumps(got)}", flush=True)
        finally:
            for cm in reversed(cms):
                cm.__exit__(None, None, None)
    finally:
        engine.shutdown()
    result["load_after"] = os.getloadavg()
    print(table(result["runs"], batches))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


def overhead_ms(c: dict[str, Any], u: dict[str, Any] | None) -> float:
    """The constraint work on the loop thread's critical path in one full-batch decode step:
    handing the masks to the worker (the submit, and the GIL the worker then holds), waiting
    for them after the forward, applying them, and the guide calls after sampling; the
    unconstrained run's submit and apply are taken off."""
    base = u or {}
    total = c["mask_start_ms"] - (base.get("mask_start_ms") or 0.0)
    total += c["mask_wait_ms"] - (base.get("mask_wait_ms") or 0.0)
    total += c["mask_apply_ms"] - (base.get("mask_apply_ms") or 0.0)
    return float(total + c["guide_loop_ms"])


def table(runs: dict[str, dict[str, Any]], batches: list[int]) -> str:
    """Markdown: per batch, the forward and each constraint part (ms, median over full-batch
    decode steps) and the critical-path overhead (`overhead_ms`) as a share of the forward."""
    lines = [
        "| batch | steps | forward ms | masks on worker ms | submit ms | wait ms | apply ms "
        "| guide calls ms | loop-thread overhead / forward | same, CPU time "
        "| step ms (unconstrained) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in batches:
        c, u = runs.get(f"json_schema@{n}"), runs.get(f"none@{n}")
        if not c or not c["steps"]:
            lines.append(f"| {n} | 0 | | | | | | | | | |")
            continue
        extra = overhead_ms(c, u)
        lines.append(
            f"| {n} | {c['steps']} | {c['forward_ms']:.1f} | {c['masks_worker_ms']:.2f} "
            f"| {c['mask_start_ms']:.2f} | {c['mask_wait_ms']:.2f} | {c['mask_apply_ms']:.2f} "
            f"| {c['guide_loop_ms']:.2f} | {100 * extra / c['forward_ms']:.1f} % "
            f"| {100 * (c.get('apply_and_guide_cpu_ratio') or 0):.1f} % "
            f"| {c['step_ms']:.1f} ({(u or {}).get('step_ms') or 0:.1f}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

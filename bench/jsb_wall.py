"""`python -m bench.jsb_wall`: a JSONSchemaBench sub-dataset constrained against unconstrained.

BENCHMARKS.md's target: all sample schemas of one sub-dataset submitted together finish within
1.5x the wall time of the same requests unconstrained with the same output lengths. Per
sub-dataset, on one in-process `Engine` (the embedded model unless --model-path):

1. constrained: every schema's request at once, as `bench.jsonschemabench` submits them
   (greedy, `max_new_tokens` 512, the paper's prompt); requests the engine refuses are left
   out of both runs (they generate nothing);
2. unconstrained: the same prompts at once, each with `max_new_tokens` set to the tokens its
   constrained request produced and EOS ignored, so both runs decode the same token counts.

The cache is flushed before each run (both prefill the same prompts), and each sub-dataset's
constrained run goes first once untimed, so no compile lands in the timed run (the compiled
grammars are cached by schema text, as a server meeting its schemas again would have them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from bench.jsonschemabench import SUB_DATASETS, load_items, prompt_ids


async def _all(engine: Any, requests: list[dict[str, Any]]) -> list[Any]:
    calls = [engine.async_generate(**r) for r in requests]
    return list(await asyncio.gather(*calls, return_exceptions=True))


def _timed(engine: Any, requests: list[dict[str, Any]]) -> tuple[float, list[Any]]:
    if not engine.flush_cache():
        raise RuntimeError("could not flush the cache: the engine still has requests")
    start = time.perf_counter()
    results = asyncio.run(_all(engine, requests))
    return time.perf_counter() - start, results


def measure(engine: Any, sub: str, limit: int | None, max_new_tokens: int) -> dict[str, Any]:
    """One sub-dataset's constrained and unconstrained wall times (see the module doc)."""
    items = load_items([sub], limit)
    constrained = [
        {
            "input_ids": prompt_ids(engine.tokenizer, i.schema),
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": max_new_tokens,
                "json_schema": i.text,
            },
        }
        for i in items
    ]
    _, first = _timed(engine, constrained)  # compiles, and finds the refused requests
    served = [r for r, out in zip(constrained, first) if not isinstance(out, BaseException)]
    wall_c, results = _timed(engine, served)
    tokens = [
        0 if isinstance(out, BaseException) else out["meta_info"]["completion_tokens"]
        for out in results
    ]
    plain = [
        {
            "input_ids": r["input_ids"],
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
        }
        for r, n in zip(served, tokens)
        if n > 0
    ]
    wall_u, _ = _timed(engine, plain)
    return {
        "sub": sub,
        "requests": len(served),
        "refused": len(constrained) - len(served),
        "output_tokens": sum(tokens),
        "constrained_s": round(wall_c, 2),
        "unconstrained_s": round(wall_u, 2),
        "ratio": round(wall_c / wall_u, 3) if wall_u else None,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Runs the sub-datasets asked for; prints a row each and the target's verdict."""
    p = argparse.ArgumentParser(prog="python -m bench.jsb_wall", description=__doc__)
    p.add_argument("--sub-datasets", default="Glaiveai2K,Kubernetes,Github_medium")
    p.add_argument("--limit", type=int, help="schemas per sub-dataset (first N by file name)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--backend", default="auto", help="EngineConfig.grammar_backend")
    p.add_argument("--model-path", help="default: the embedded SmolLM2")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    subs = [s for s in args.sub_datasets.split(",") if s]
    unknown = sorted(set(subs) - set(SUB_DATASETS))
    if unknown:
        p.error(f"unknown sub-datasets {unknown}; known: {', '.join(SUB_DATASETS)}")
    from sgl_lite.backend.engine import Engine

    print(f"jsb_wall: num_threads={args.num_threads}, backend {args.backend}", flush=True)
    rows = []
    with Engine(
        args.model_path,
        num_threads=args.num_threads,
        grammar_backend=args.backend,
        log_level="warning",
    ) as engine:
        for sub in subs:
            row = measure(engine, sub, args.limit, args.max_new_tokens)
            verdict = "met" if row["ratio"] is not None and row["ratio"] <= 1.5 else "MISSED"
            print(
                f"  {sub}: {row['requests']} requests, {row['output_tokens']} tokens: "
                f"constrained {row['constrained_s']} s, unconstrained {row['unconstrained_s']} s, "
                f"ratio {row['ratio']} (target <= 1.5: {verdict})",
                flush=True,
            )
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])

"""Decode against prefill logprobs, as SGLang's `test_srt_endpoint.py::test_logprob_match`
measures them, in process: sample tokens with `return_logprob`, re-score the prompt and output
ids by one prefill (`logprob_start_len=0`, `max_new_tokens=0`), compare per token.

    python scripts/logprob_match.py [--dtype float32] [--quantization none] [--deterministic]
        [--seeds 0 1 2] [--tokens 512] [--json out.json]

Prints, per seed, the largest and mean |difference| and how many tokens differ by more than
SGLang's 0.35. `SGL_LITE_DISABLE_ORT_STEP=1` in the environment decodes on torch instead of
the onnxruntime graph.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROMPT = "I have a very good idea on how to"  # SGLang's
SGLANG_DELTA = 0.35


def measure(engine, seed: int, tokens: int) -> dict:
    """One sampled run and its prefill re-score: the differences' summary."""
    started = time.perf_counter()
    gen = engine.generate(
        PROMPT,
        sampling_params={
            "temperature": 1.0,
            "max_new_tokens": tokens,
            "ignore_eos": True,
            "sampling_seed": seed,
        },
        return_logprob=True,
        logprob_start_len=0,
    )
    meta = gen["meta_info"]
    decoded = [entry[0] for entry in meta["output_token_logprobs"]]
    ids = [e[1] for e in meta["input_token_logprobs"]] + [
        e[1] for e in meta["output_token_logprobs"]
    ]
    score = engine.generate(
        input_ids=ids,
        sampling_params={"temperature": 1.0, "max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    rescored = [e[0] for e in score["meta_info"]["input_token_logprobs"][meta["prompt_tokens"] :]]
    diffs = [abs(a - b) for a, b in zip(decoded, rescored, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return {
        "seed": seed,
        "tokens": len(diffs),
        "max": max(diffs),
        "mean": sum(diffs) / len(diffs),
        "over_sglang_delta": sum(d > SGLANG_DELTA for d in diffs),
        "worst_position": worst,
        "worst_decode_logprob": decoded[worst],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Builds one engine in the asked mode and prints each seed's differences."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", default=None, help="auto, float32, bfloat16 (default: auto)")
    p.add_argument("--quantization", default=None, help="auto, none, int8, int4")
    p.add_argument("--deterministic", action="store_true", help="enable_deterministic_inference")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)

    from sgl_lite.backend.engine import Engine

    kwargs: dict = {"num_threads": args.num_threads}
    if args.dtype:
        kwargs["dtype"] = args.dtype
    if args.quantization:
        kwargs["quantization"] = args.quantization
    if args.deterministic:
        kwargs["enable_deterministic_inference"] = True
    with Engine(**kwargs) as engine:
        runs = []
        for seed in args.seeds:
            runs.append(measure(engine, seed, args.tokens))
            print(json.dumps(runs[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"engine": kwargs, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.run`: every workload on every system in one process, same weights.

Each system runs each workload `--repeats` times (cache flushed between repetitions, one warm-up
request per system before any timing); figures are medians. Correctness is checked on the way:
W1 answers against HF-alone turn by turn on identical prompts, W2 decisions against HF-alone's,
W3 outputs against the schema. A system that cannot run a workload is reported as skipped.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bench import chart, docs_table, report, w3_backends
from bench.common import Skipped, median, on_own_thread
from bench.workloads import Workloads, build
from sgl_lite.backend import omp_policy

TITLES = {
    "W1": "multi-turn chat",
    "W2": "few-shot select",
    "W3": "JSON extraction",
    "W3B": "JSON extraction on each grammar backend, budget on/off",
    "W3T": "JSON extraction at 1.2x the shortest valid output",
    "W4": "raw decode (tokens/s)",
    "W5": "DSL programs vs engine API",
}
# W4 also runs the engine in each explicit weight mode (the `sgl_lite` row is the default).
SGL_MODES = ("deterministic", "float32", "bfloat16")
PACKAGES = (
    "torch",
    "transformers",
    "sgl_lite",
    "jsonschema",
    "outlines",
    "outlines_core",
    "llama_cpp_python",
    "matplotlib",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--workloads", default="W1,W2,W3,W3B,W3T,W4,W5")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="results")
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 conversation x 2 turns, 2 questions, 2 JSON items, 8 new tokens",
    )
    p.add_argument("--conversations", type=int)
    p.add_argument("--questions", type=int)
    p.add_argument("--json-items", type=int)
    # The smoke test's knobs (tests/e2e/test_bench_smoke.py): the same paths on less decoding.
    p.add_argument("--json-max-new-tokens", type=int, help="W3's budget (default 64)")
    p.add_argument("--decode-batch", type=int, help="W4's batch (default 16, 4 with --quick)")
    p.add_argument(
        "--no-peers", action="store_true", help="skip llama-cpp-python, outlines and vLLM"
    )
    p.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM without torch.compile (its start-up compiles for minutes on 2 cores)",
    )
    p.add_argument(
        "--vllm-dtype",
        default="auto",
        choices=("auto", "bfloat16", "float32"),
        help="vLLM's dtype; auto: its best here, bf16 where the CPU has a bf16 GEMM",
    )
    return p.parse_args(argv)


def environment(args: argparse.Namespace) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "torch_threads": torch.get_num_threads(),
        "dtype": "engine default (see weights)",
        "device": "cpu",
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
        "load_average": os.getloadavg(),
        "openmp_wait_policy": omp_policy.note(),
        "repeats": args.repeats,
        "quick": args.quick,
    }


def workload_sizes(wl: Workloads) -> dict[str, Any]:
    return {
        "conversations": len(wl.conversations),
        "turns": len(wl.conversations[0]),
        "chat_max_new_tokens": wl.chat_max_new_tokens,
        "questions": len(wl.questions),
        "json_items": len(wl.products),
        "json_max_new_tokens": wl.json_max_new_tokens,
        "decode_new_tokens_batch1": wl.decode_new_tokens_b1,
        "decode_batch": len(wl.decode_prompts),
        "decode_new_tokens_batch": wl.decode_new_tokens_batch,
    }


def aggregate(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of numeric figures over repetitions; everything else from the last one."""
    out: dict[str, Any] = {}
    for key, value in reps[-1].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = median([r[key] for r in reps])
        else:
            out[key] = value
    if "wall_s" in reps[-1]:
        out["wall_s_all"] = [r["wall_s"] for r in reps]
    return out


def measure(system: Any, method: str, wl: Workloads, repeats: int) -> dict[str, Any]:
    try:
        return aggregate([on_own_thread(getattr(system, method), wl) for _ in range(repeats)])
    except Skipped as exc:
        return {"skipped": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        return {"skipped": f"{type(exc).__name__}: {exc}"}


def w1_agreement(a: dict, b: dict, hf_model: Any) -> tuple[float | None, list[dict]]:
    """Turn-by-turn agreement of two W1 runs where their prompts are identical; for each
    disagreement, the HF model's top-2 logit margin at the first differing token."""
    from bench.hf_baselines import top2_margin
    from sgl_lite.common import common_prefix_len

    ra, rb = a["_run"], b["_run"]
    compared, agreed, diffs = 0, 0, []
    for c, (pa, pb) in enumerate(zip(ra.prompts, rb.prompts)):
        for t, (xa, xb) in enumerate(zip(pa, pb)):
            if xa != xb:
                continue
            compared += 1
            oa, ob = ra.answers[c][t], rb.answers[c][t]
            if oa == ob:
                agreed += 1
                continue
            i = common_prefix_len(oa, ob)
            diffs.append(
                {
                    "conversation": c,
                    "turn": t,
                    "token": i,
                    "hf_top2_margin": on_own_thread(top2_margin, hf_model, xa, oa[:i]),
                }
            )
    return (agreed / compared if compared else None), diffs


def run_workload(
    w: str, wl: Workloads, systems: dict[str, Any], results: dict, args: argparse.Namespace
) -> dict[str, Any]:
    block: dict[str, Any] = {"title": TITLES[w], "systems": {}, "notes": []}
    if w == "W5":
        return run_w5(wl, systems, results, args, block)
    if w == "W3B":
        pairs = systems["w3_engine_pairs"]
        return w3_backends.run_backends(pairs, wl, args.repeats, block)
    if w == "W3T":
        peers = {name: tight_peer(name, args) for name in ("outlines", "llama_cpp")}
        tokenizer = systems["sgl_lite"].tokenizer
        pairs = systems["w3_engine_pairs"]
        return w3_backends.run_tight(pairs, wl, tokenizer, args.repeats, block, peers)
    method = w.lower()
    for name in report.WORKLOAD_SYSTEMS[w]:
        system = systems.get(name)
        if isinstance(system, str):
            block["systems"][name] = {"skipped": system}
            continue
        if not hasattr(system, method):
            block["systems"][name] = {"skipped": f"{name} has no {w} runner"}
            continue
        print(f"[{w}] {name} ...", flush=True)
        block["systems"][name] = measure(system, method, wl, args.repeats)
    figs = block["systems"]
    base = figs.get("hf_alone", {})
    key = report.MAIN_FIGURE[w]
    for f in figs.values():
        if key in f and key in base and f[key]:
            f["ratio_vs_hf_alone"] = (base[key] / f[key]) if key == "wall_s" else f[key] / base[key]
    if w == "W1" and "_run" in base:
        for name, f in figs.items():
            if "_run" in f and name != "hf_alone":
                rate, diffs = w1_agreement(f, base, systems["hf_model"])
                f["agreement_with_hf_alone"], f["disagreements"] = rate, diffs
    if w == "W2" and "decisions" in base:
        for f in figs.values():
            if "decisions" in f:
                same = sum(x == y for x, y in zip(f["decisions"], base["decisions"]))
                f["agreement_with_hf_alone"] = same / len(base["decisions"])
        block["answers"] = [
            {
                "question": q[0].splitlines()[0],
                "correct": q[2],
                **{n: q[1][f["decisions"][i]] for n, f in figs.items() if "decisions" in f},
            }
            for i, q in enumerate(wl.questions)
        ]
    for f in figs.values():
        f.pop("_run", None)
    if w == "W1":
        block["notes"].append(
            "TTFT: sgl_lite from its turn's batch submission (streamed); the "
            "sequential systems from the start of their own call, so queueing "
            "behind other conversations is not counted against them"
        )
    if w == "W4":
        block["notes"].append(
            "tokens/s = new tokens / wall time of the call, prefill of the "
            "~90-token prompt(s) included; HF batches with left padding"
        )
    if w == "W3":
        block["notes"].append(
            "constrained/unconstrained per-token: jump-forward off, the same "
            "per-request token counts unconstrained with EOS ignored"
        )
    return block


def run_w5(
    wl: Workloads, systems: dict[str, Any], results: dict, args: argparse.Namespace, block: dict
) -> dict[str, Any]:
    dsl = systems.get("sgl_lite_dsl")
    for w in ("W1", "W2", "W3"):
        if isinstance(dsl, str):
            block["systems"][w] = {"skipped": dsl}
            continue
        engine_figs = report._get(results, "workloads", w, "systems", "sgl_lite")
        if not engine_figs or "wall_s" not in engine_figs:
            engine_figs = measure(systems["sgl_lite"], w.lower(), wl, args.repeats)
        print(f"[W5] {w} as a DSL program ...", flush=True)
        figs = measure(dsl, w.lower(), wl, args.repeats)
        if "skipped" in figs or "skipped" in engine_figs:
            block["systems"][w] = {"skipped": figs.get("skipped") or engine_figs["skipped"]}
            continue
        figs = {"dsl_wall_s": figs.pop("wall_s"), "engine_wall_s": engine_figs["wall_s"], **figs}
        figs["dsl_over_engine"] = figs["dsl_wall_s"] / figs["engine_wall_s"]
        if w == "W2" and "decisions" in engine_figs:
            figs["decisions_agree_with_engine"] = figs["decisions"] == engine_figs["decisions"]
        block["systems"][w] = figs
    return block


def workload_options(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    """The `build()` options a peer's own process rebuilds the workloads from."""
    return {
        "quick": args.quick,
        "conversations": args.conversations,
        "questions": args.questions,
        "json_items": args.json_items,
        "json_max_new_tokens": args.json_max_new_tokens,
        "decode_batch": args.decode_batch,
        **more,
    }


def tight_peer(name: str, args: argparse.Namespace) -> Any:
    """For W3T: a callable building peer `name` at a given max_new_tokens (its own process
    rebuilds the workloads), or why the peer is missing."""
    if args.no_peers:
        return "--no-peers"
    from bench.isolated import IsolatedPeer

    def make(max_new_tokens: int) -> Any:
        options = workload_options(args, json_max_new_tokens=max_new_tokens)
        try:
            peer = IsolatedPeer(name, args.num_threads, options)
            peer.warmup()
            return peer
        except Skipped as exc:
            return str(exc)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    return make


def vllm_dtype(requested: str) -> str:
    """The dtype vLLM runs in: `requested`, or for auto its best mode on this CPU (bf16 where
    oneDNN has a native bf16 GEMM, as a vLLM user there would run it; float32 elsewhere)."""
    if requested != "auto":
        return requested
    from sgl_lite.backend.runner.weights.cpu import cpu_caps

    return "bfloat16" if cpu_caps().fast_bf16 else "float32"


def vllm_peer(args: argparse.Namespace, tokenizer: Any, folder: Path | None) -> Any:
    """vLLM's CPU build in `.venv-vllm` (bench/vllm_peer.py), or why it is missing."""
    if args.no_peers:
        return "--no-peers"
    if folder is None:
        return "the engine has no Hugging Face model folder for vLLM to load"
    from bench.vllm_peer import VllmPeer

    try:
        dtype = vllm_dtype(args.vllm_dtype)
        return VllmPeer(args.num_threads, tokenizer, folder, dtype=dtype, eager=args.vllm_eager)
    except Skipped as exc:
        return str(exc)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


STARTUP_CHILD = """
import json, sys, time
start = time.perf_counter()
from sgl_lite import Engine
imported = time.perf_counter()
engine = Engine(model_path="default", num_threads=int(sys.argv[1]), log_level="warning")
ready = time.perf_counter()
print(json.dumps({"import_s": imported - start, "engine_s": ready - imported}))
engine.shutdown()
"""


def measure_startup(num_threads: int) -> dict[str, Any]:
    """A fresh process's start-up with the embedded model already converted (the issue's
    figure): seconds to import sgl_lite and to construct a ready `Engine` (load, pack, probe).
    Run first, before this process loads anything, so it has the machine to itself."""
    import json
    import subprocess

    for _ in range(2):  # the first converts (if needed) and warms the page cache; untimed
        out = subprocess.run(
            [sys.executable, "-c", STARTUP_CHILD, str(num_threads)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode != 0:
            return {"skipped": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["total_s"] = figures["import_s"] + figures["engine_s"]
    return {k: round(v, 2) for k, v in figures.items()}


def build_systems(args: argparse.Namespace, workloads: list[str]) -> dict[str, Any]:
    """Every system, or the reason it is missing (a string)."""
    from bench.hf_baselines import HFAlone, HFManualCache, dense_checkpoint, load_hf_model
    from bench.sgl_engine import SglLite

    sgl = SglLite(args.num_threads)
    model = on_own_thread(load_hf_model, sgl.engine.model_folder)
    systems: dict[str, Any] = {
        "sgl_lite": sgl,
        "hf_model": model,
        "hf_alone": HFAlone(model, sgl.tokenizer),
        "hf_manual_cache": HFManualCache(model, sgl.tokenizer),
    }
    from bench.isolated import IsolatedPeer

    # Each peer runs in its own process: a peer that crashes costs its rows, not the run.
    for name in ("llama_cpp", "outlines"):
        if args.no_peers:
            systems[name] = "--no-peers"
            continue
        try:
            systems[name] = IsolatedPeer(name, args.num_threads, workload_options(args))
        except Skipped as exc:
            systems[name] = str(exc)
        except Exception as exc:
            systems[name] = f"{type(exc).__name__}: {exc}"
    systems["vllm"] = vllm_peer(args, sgl.tokenizer, dense_checkpoint(sgl.engine.model_folder))
    if "W4" in workloads:
        from bench.sgl_engine import SglLiteMode

        for mode in SGL_MODES:
            systems[f"sgl_lite_{mode}"] = SglLiteMode(args.num_threads, mode)
    if "W3B" in workloads or "W3T" in workloads:
        systems["w3_engine_pairs"] = w3_backends.EnginePairs(args.num_threads)
    if "W5" in workloads:
        try:
            from bench.dsl import DslRunner

            systems["sgl_lite_dsl"] = DslRunner(sgl.engine)
        except Skipped as exc:
            systems["sgl_lite_dsl"] = str(exc)
    for system in systems.values():
        if hasattr(system, "warmup"):
            on_own_thread(system.warmup)
    return systems


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    os.environ["SGL_LITE_NUM_THREADS"] = str(args.num_threads)
    chosen = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in TITLES]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; choose from {list(TITLES)}")
    wl = build(**workload_options(args))
    results: dict[str, Any] = {
        "env": environment(args),
        "sizes": workload_sizes(wl),
        "workloads": {},
    }
    print(
        "torch threads",
        torch.get_num_threads(),
        "| the engine's default (fast) mode (W4 also deterministic, float32, bf16) | cpu |",
        results["env"]["cpu_model"],
        "|",
        results["env"]["versions"],
        flush=True,
    )
    results["env"]["startup"] = (
        {"skipped": "--quick"} if args.quick else measure_startup(args.num_threads)
    )
    print("start-up of a fresh engine process:", results["env"]["startup"], flush=True)
    start = time.perf_counter()
    systems = build_systems(args, chosen)
    results["env"]["weights"] = systems["sgl_lite"].engine.runner.format.describe()
    results["env"]["device"] = systems["sgl_lite"].engine.config.device
    try:
        for w in chosen:
            results["workloads"][w] = run_workload(w, wl, systems, results, args)
    finally:
        for system in systems.values():
            if hasattr(system, "shutdown"):
                system.shutdown()
    results["env"]["total_s"] = time.perf_counter() - start
    results["env"]["load_average_end"] = os.getloadavg()
    report.print_report(results)
    out = Path(args.out)
    print(f"\nresults: {report.write_json(results, out)}")
    print(chart.write_chart(results, out))
    print(docs_table.write(out / "bench_results.json", out / "performance.md"))
    return results


if __name__ == "__main__":
    main()

"""Results → tables, the targets of BENCHMARKS.md marked met or missed, a JSON file.

This module only reads the results dict that `bench.run` builds; it runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

# The fields every results file has (the smoke test checks them); a skipped system or workload
# carries {"skipped": reason} instead of its figures.
REQUIRED_ENV = (
    "torch_threads",
    "dtype",
    "device",
    "cpu_model",
    "versions",
    "load_average",
    "openmp_wait_policy",
    "startup",
    "repeats",
    "quick",
)
WORKLOAD_SYSTEMS = {
    "W1": ("sgl_lite", "hf_alone", "hf_manual_cache", "llama_cpp", "vllm"),
    "W2": ("sgl_lite", "hf_alone", "hf_manual_cache", "llama_cpp", "vllm"),
    "W3": ("sgl_lite", "hf_alone", "outlines", "llama_cpp", "vllm"),
    "W4": (
        "sgl_lite",
        "sgl_lite_deterministic",
        "sgl_lite_float32",
        "sgl_lite_bfloat16",
        "hf_alone",
        "llama_cpp",
        "vllm",
    ),
    "W5": ("W1", "W2", "W3"),
    # sgl_lite on each grammar backend (bench/w3_backends.py ROWS), and in W3T the peers too
    "W3B": ("sgl_outlines", "sgl_outlines_no_budget", "sgl_llguidance", "sgl_xgrammar"),
    "W3T": (
        "sgl_outlines",
        "sgl_outlines_no_budget",
        "sgl_llguidance",
        "sgl_xgrammar",
        "outlines",
        "llama_cpp",
    ),
}
MAIN_FIGURE = {"W1": "wall_s", "W2": "wall_s", "W3": "wall_s", "W4": "batch1_tokens_per_s"}


class Target(NamedTuple):
    figure: str
    target: str
    value: float | None
    status: str  # "met" | "missed" | "n/a: reason"


def _get(results: dict, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _ratio(results: dict, w: str, num: str, den: str, key: str = "wall_s") -> float | None:
    a, b = (
        _get(results, "workloads", w, "systems", num, key),
        _get(results, "workloads", w, "systems", den, key),
    )
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _why(results: dict, w: str, *systems: str) -> str:
    for s in systems:
        if _get(results, "workloads", w, "systems", s, "skipped"):
            return f"n/a: {w} {s} skipped (reason above)"
    if _get(results, "workloads", w) is None:
        return f"n/a: {w} not run"
    for s in systems:
        if _get(results, "workloads", w, "systems", s) is None:
            return f"n/a: {w} {s} not measured"
    return "n/a"


def _mark(figure: str, target: str, value: float | None, ok: bool | None, why: str) -> Target:
    if value is None or ok is None:
        return Target(figure, target, None, why)
    return Target(figure, target, value, "met" if ok else "missed")


def _at_least(
    r: dict, figure: str, target: str, minimum: float, w: str, num: str, den: str, key="wall_s"
) -> Target:
    """A "ratio num / den of workload w's `key` is at least `minimum`" target."""
    v = _ratio(r, w, num, den, key)
    return _mark(figure, target, v, v is not None and v >= minimum, _why(r, w, num, den))


def evaluate_targets(r: dict) -> list[Target]:
    """The targets table of BENCHMARKS.md against this run's figures."""
    out = []
    out.append(
        _at_least(r, "W1 wall, HF-alone / sgl_lite", ">= 6x", 6.0, "W1", "hf_alone", "sgl_lite")
    )
    out.append(
        _at_least(
            r,
            "W1 wall, HF-manual-cache / sgl_lite",
            ">= 2x",
            2.0,
            "W1",
            "hf_manual_cache",
            "sgl_lite",
        )
    )
    # BENCHMARKS.md: >= 2x llama-cpp-python (requests one after another), >= 1.5x vLLM CPU.
    for peer, label, bar in (("llama_cpp", "llama-cpp-python", 2.0), ("vllm", "vLLM CPU", 1.5)):
        for w in ("W1", "W2", "W3"):
            figure = f"{w} wall, {label} / sgl_lite"
            out.append(_at_least(r, figure, f">= {bar:g}x", bar, w, peer, "sgl_lite"))
    sub = _get(r, "workloads", "W1", "systems", "sgl_lite", "prompt_tokens_submitted")
    comp = _get(r, "workloads", "W1", "systems", "sgl_lite", "prompt_tokens_computed")
    v = comp / sub if sub else None
    out.append(
        _mark(
            "W1 prefill computed / submitted",
            "<= 12%",
            v,
            v is not None and v <= 0.12,
            _why(r, "W1", "sgl_lite"),
        )
    )
    out.append(
        _at_least(r, "W2 wall, HF-alone / sgl_lite", ">= 14x", 14, "W2", "hf_alone", "sgl_lite")
    )
    v = _get(r, "workloads", "W3", "systems", "sgl_lite", "valid_fraction")
    out.append(
        _mark(
            "W3 valid outputs",
            "100%",
            v,
            v == 1.0 if v is not None else None,
            _why(r, "W3", "sgl_lite"),
        )
    )
    v = _get(
        r, "workloads", "W3", "systems", "sgl_lite", "constrained_over_unconstrained_per_token"
    )
    out.append(
        _mark(
            "W3 constrained / unconstrained per-token time",
            "<= 1.05",
            v,
            v is not None and v <= 1.05,
            _why(r, "W3", "sgl_lite"),
        )
    )
    v = _get(r, "workloads", "W3", "systems", "sgl_lite", "jump_forward_passes_saved")
    out.append(
        _mark(
            "W3 forward passes saved by jump-forward",
            ">= 25%",
            v,
            v is not None and v >= 0.25,
            _why(r, "W3", "sgl_lite"),
        )
    )
    v = _get(r, "workloads", "W3T", "systems", "sgl_outlines", "valid_fraction")
    out.append(
        _mark(
            "W3T valid outputs at 1.2x the shortest (budget on)",
            "100%",
            v,
            v == 1.0 if v is not None else None,
            _why(r, "W3T", "sgl_outlines"),
        )
    )
    out.append(
        _at_least(
            r,
            "W4 batch-1 tok/s, sgl_lite / HF generate",
            ">= 1.0",
            1.0,
            "W4",
            "sgl_lite",
            "hf_alone",
            "batch1_tokens_per_s",
        )
    )
    out.append(
        _at_least(
            r,
            "W4 batch-1 tok/s, sgl_lite (default, fast) / llama-cpp-python",
            ">= 1.0",
            1.0,
            "W4",
            "sgl_lite",
            "llama_cpp",
            "batch1_tokens_per_s",
        )
    )
    out.append(
        _at_least(
            r,
            "W4 batch-1 tok/s, sgl_lite default (fast) / sgl_lite float32",
            ">= 2x",
            2,
            "W4",
            "sgl_lite",
            "sgl_lite_float32",
            "batch1_tokens_per_s",
        )
    )
    out.append(
        _at_least(
            r,
            "W4 prefill tok/s, sgl_lite default (fast) / sgl_lite float32",
            ">= 1.0",
            1.0,
            "W4",
            "sgl_lite",
            "sgl_lite_float32",
            "prefill_tokens_per_s",
        )
    )
    # Issue 36's bars against vLLM CPU in its best mode (bf16 where the CPU has a bf16 GEMM,
    # compiled): the 16 prompts' aggregate, and prefill of the same joined prompt.
    out.append(
        _at_least(
            r,
            "W4 16 prompts aggregate tok/s, sgl_lite / vLLM CPU",
            ">= 1.5",
            1.5,
            "W4",
            "sgl_lite",
            "vllm",
            "batch_tokens_per_s",
        )
    )
    out.append(
        _at_least(
            r,
            "W4 prefill tok/s, sgl_lite / vLLM CPU",
            ">= 1.0",
            1.0,
            "W4",
            "sgl_lite",
            "vllm",
            "prefill_tokens_per_s",
        )
    )
    b1 = _get(r, "workloads", "W4", "systems", "sgl_lite", "batch1_tokens_per_s")
    bn = _get(r, "workloads", "W4", "systems", "sgl_lite", "batch_tokens_per_s")
    vs_hf = _ratio(r, "W4", "sgl_lite", "hf_alone", "batch_tokens_per_s")
    v = bn / b1 if b1 and bn else None
    ok = v is not None and vs_hf is not None and v >= 5 and vs_hf >= 1.5
    out.append(
        _mark(
            f"W4 batch aggregate / batch-1 (vs HF batched: "
            f"{'n/a' if vs_hf is None else f'{vs_hf:.2f}x'})",
            ">= 5x and >= 1.5x HF",
            v,
            ok if v is not None else None,
            _why(r, "W4", "sgl_lite", "hf_alone"),
        )
    )
    ratios = [
        _get(r, "workloads", "W5", "systems", w, "dsl_over_engine") for w in ("W1", "W2", "W3")
    ]
    have = [x for x in ratios if isinstance(x, (int, float))]
    label = ", ".join("n/a" if x is None else f"{x:.2f}" for x in ratios)
    out.append(
        _mark(
            f"W5 DSL / engine-API wall (W1, W2, W3: {label})",
            "<= 1.10",
            max(have) if have else None,
            all(x <= 1.10 for x in have) if have else None,
            _why(r, "W5", "W1", "W2", "W3"),
        )
    )
    return out


# --- printing -----------------------------------------------------------------------------------
def _fmt(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    cells = [header] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n## {title}")
    for i, row in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


WORKLOAD_COLUMNS = {
    "W1": [
        "wall_s",
        "ttft_mean_s",
        "prompt_tokens_submitted",
        "prompt_tokens_computed",
        "cache_hit_rate",
        "agreement_with_hf_alone",
    ],
    "W2": ["wall_s", "accuracy", "agreement_with_hf_alone", "prompt_tokens_computed"],
    "W3": [
        "wall_s",
        "valid_fraction",
        "tokens_emitted",
        "forward_passes_jump_forward",
        "forward_passes_no_jump_forward",
        "constrained_over_unconstrained_per_token",
    ],
    "W4": ["batch1_tokens_per_s", "batch_tokens_per_s", "batch_size", "prefill_tokens_per_s"],
    "W5": ["dsl_wall_s", "engine_wall_s", "dsl_over_engine"],
    # W3B / W3T rows are grammar backends (and, in W3T, the peers), see bench/w3_backends.py
    "W3B": [
        "wall_s",
        "valid_fraction",
        "constrained_over_unconstrained_per_token",
        "jump_forward_passes_saved",
        "invalid_reported",
    ],
    "W3T": [
        "wall_s",
        "valid_fraction",
        "invalid_reported",
        "tokens_emitted",
        "jump_forward_passes_saved",
    ],
}


def figure_notes(name: str, figs: dict) -> list[str]:
    """A system's own notes on its figures (keys ending in `_note`), one line each."""
    return [f"{name}: {v}" for k, v in figs.items() if k.endswith("_note") and v]


def print_report(results: dict) -> None:
    env = results["env"]
    print("\n# sgl_lite benchmark")
    for key in REQUIRED_ENV:
        print(f"- {key}: {env[key]}")
    if "weights" in env:
        print(f"- sgl_lite weights (engine default): {env['weights']}")
    print(f"- workload sizes: {results.get('sizes')}")
    for w, block in results["workloads"].items():
        cols = WORKLOAD_COLUMNS[w]
        ratio_name = "x vs HF-alone" if w != "W5" else ""
        rows, notes = [], list(block.get("notes", []))
        for name, figs in block["systems"].items():
            if "skipped" in figs:
                rows.append([name, "skipped"] + [""] * len(cols))
                notes.append(f"{name} skipped: {figs['skipped']}")
                continue
            rows.append(
                [name] + [figs.get(c, "") for c in cols] + [figs.get("ratio_vs_hf_alone", "")]
            )
        header = ["system"] + cols + ([ratio_name] if ratio_name else [""])
        print_table(f"{w}: {block['title']}", header, rows)
        for name, figs in block["systems"].items():
            if w == "W4" and "weights" in figs:
                notes.append(f"{name} weights: {figs['weights']}")
            notes += figure_notes(name, figs)
            for d in figs.get("disagreements") or []:
                notes.append(
                    f"{name} differs from hf_alone: conversation {d['conversation']} "
                    f"turn {d['turn']} at token {d['token']} (HF top-2 logit margin "
                    f"there {d['hf_top2_margin']:.3g})"
                )
        for note in notes:
            print(f"  - {note}")
        if block.get("answers"):
            names = [k for k in block["answers"][0] if k not in ("question", "correct")]
            print_table(
                f"{w} answers",
                ["question", "correct", *names],
                [
                    [a["question"].removeprefix("Question: "), a["correct"], *[a[n] for n in names]]
                    for a in block["answers"]
                ],
            )
    title = "Targets (BENCHMARKS.md)"
    if env.get("quick") or (results.get("sizes") or {}).get("conversations", 8) < 8:
        title += " -- reduced workload: indicative only, not the benchmark's figures"
    print_table(
        title,
        ["figure", "target", "value", "status"],
        [[t.figure, t.target, t.value, t.status] for t in evaluate_targets(results)],
    )


# --- files ------------------------------------------------------------------------------------
def write_json(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_results.json"
    data = {**results, "targets": [t._asdict() for t in evaluate_targets(results)]}
    path.write_text(json.dumps(data, indent=2, default=str))
    return path

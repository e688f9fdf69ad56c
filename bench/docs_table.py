"""`python -m bench.docs_table`: docs/performance.md, rendered from the results file of a run.

It reads the JSON that `bench.run` writes (`report.write_json`: `env`, `sizes`, `workloads`) and
renders it as Markdown: where and how the figures were measured, a summary, the targets as
`report.evaluate_targets` marks them, and one table per workload with the columns of the
terminal report (`report.WORKLOAD_COLUMNS`). It runs no benchmark and reads nothing but the JSON
(and whether the chart sits beside it), so the page changes only when the results file or this
renderer does; tests/unit/test_performance_doc.py checks that the committed page is this
module's rendering of the committed JSON. `bench.run` calls `write` after every run.

    python -m bench.docs_table            # docs/bench_results.json -> docs/performance.md
    python -m bench.docs_table --check    # exit 1 if docs/performance.md is stale
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import report
from bench.workloads import build

DOCS = Path(__file__).resolve().parents[1] / "docs"
DEFAULT_RESULTS = DOCS / "bench_results.json"
DEFAULT_OUT = DOCS / "performance.md"
CHART = "bench_ratios.png"  # bench.chart writes it beside the JSON
NAMES = {
    "sgl_lite": "sgl_lite",
    "sgl_lite_deterministic": "sgl_lite deterministic",
    "sgl_lite_float32": "sgl_lite float32",
    "sgl_lite_bfloat16": "sgl_lite bf16",
    "sgl_lite_auto": "sgl_lite `auto`",  # earlier results: the int mode before it was the default
    "sgl_lite_int8": "sgl_lite int8",
    "hf_alone": "HF-alone",
    "hf_manual_cache": "HF-manual-cache",
    "llama_cpp": "llama-cpp-python",
    "outlines": "outlines",
    "vllm": "vLLM (CPU)",
}
# The summary: one row per (workload, figure); a ratio over HF-alone, higher is better.
SUMMARY = (
    ("W1", "wall_s", "W1 multi-turn chat, wall (s)"),
    ("W2", "wall_s", "W2 few-shot select, wall (s)"),
    ("W3", "wall_s", "W3 JSON extraction, wall (s)"),
    ("W4", "batch1_tokens_per_s", "W4 decode, batch 1 (tok/s)"),
    ("W4", "batch_tokens_per_s", "W4 decode, {batch} prompts together (tok/s)"),
)
HOW = """\
## How the bench measures

- Every system runs every workload `--repeats` times from a flushed cache, after one warm-up
  request; the figures are medians. Each in-process system is timed as if alone in its process
  (`bench.common.on_own_thread`: one OpenMP team, see `sgl_lite/backend/omp_threads.py`); each
  optional peer (llama-cpp-python, outlines, vLLM) runs in a process of its own
  (`bench/isolated.py`, `bench/vllm_peer.py`), so a peer that crashes costs its rows, not the run.
- HF-alone is transformers' `generate` with every prompt recomputed (select: one forward pass
  per choice); HF-manual-cache keeps and extends `past_key_values` per conversation and
  prefills the W2 few-shot prefix once, copying it per question (`bench/hf_baselines.py`).
  llama-cpp-python runs the same GGUF file (`make bench-peers` builds it); vLLM's CPU build
  runs the same weights, dequantized from the GGUF into a float32 folder
  (`bench.hf_baselines.dense_checkpoint`), in a venv of its own (`.venv-vllm`,
  `make bench-vllm`) and a process of its own (`bench/vllm_peer.py`). Its W2 scores every
  choice from the prompt logprobs of the choice's whole prompt, all in one
  `LLM.generate`, once as vLLM does by default (no prefix-cache reads for a request asking for
  prompt logprobs) and once with cache reads on; the faster is its figure, the note says both.
- Correctness is checked on the way: W1 answers against HF-alone's turn by turn on identical
  prompts, W2 decisions against HF-alone's, W3 outputs against the schema (`jsonschema`).
- The workloads are fixed texts (`bench/workloads.py`): W1 multi-turn chat, W2 few-shot select,
  W3 JSON extraction (W3B on each grammar backend, W3T at 1.2x the shortest valid output), W4
  raw decode, W5 the same programs written in the DSL.
- Only ratios measured in one run mean anything: the machines are shared and noisy.
"""


def _cell(value: Any) -> str:
    """A table cell: `report._fmt`'s numbers (the terminal report's), pipes escaped."""
    return report._fmt(value).replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A GitHub Markdown table; cells formatted as in the terminal report."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def run_command(results: dict) -> str:
    """The `bench.run` command line the file came from: as recorded (`env.command`), else
    rebuilt from what it records (workloads run, repeats, threads, quick, sizes, peers)."""
    env = results["env"]
    if env.get("command"):
        return str(env["command"])
    parts = ["python -m bench.run", "--workloads", ",".join(results["workloads"])]
    parts += ["--repeats", str(env["repeats"]), "--num-threads", str(env["torch_threads"])]
    if env.get("quick"):
        parts.append("--quick")
    sizes = results.get("sizes") or {}
    default = build(quick=bool(env.get("quick")))
    for flag, key, n in (
        ("--conversations", "conversations", len(default.conversations)),
        ("--questions", "questions", len(default.questions)),
        ("--json-items", "json_items", len(default.products)),
        ("--json-max-new-tokens", "json_max_new_tokens", default.json_max_new_tokens),
        ("--decode-batch", "decode_batch", len(default.decode_prompts)),
    ):
        if key in sizes and sizes[key] != n:
            parts += [flag, str(sizes[key])]
    skipped = [
        figs.get("skipped")
        for block in results["workloads"].values()
        for figs in block["systems"].values()
    ]
    if "--no-peers" in skipped:
        parts.append("--no-peers")
    return " ".join(parts)


def _environment(results: dict) -> list[str]:
    env, versions = results["env"], results["env"].get("versions", {})
    cpu = env["cpu_model"] + (f" ({env['cpu_count']} CPUs)" if env.get("cpu_count") else "")
    load = env.get("load_average") or []
    load_end = env.get("load_average_end") or []
    rows: list[list[Any]] = [
        ["CPU", cpu],
        ["device", env["device"]],
        ["torch threads", env["torch_threads"]],
        ["sgl_lite weights", env.get("weights") or env["dtype"]],
        ["repeats (figures are medians)", env["repeats"]],
        ["quick (reduced workloads)", env["quick"]],
        ["python", env.get("python", "?")],
        ["versions", ", ".join(f"{k} {v}" for k, v in versions.items())],
        [
            "load average (1 min) at start / end",
            f"{_cell(load[0]) if load else '?'} / {_cell(load_end[0]) if load_end else '?'}",
        ],
    ]
    if "openmp_wait_policy" in env:
        rows.append(["OpenMP wait policy", env["openmp_wait_policy"]])
    startup = env.get("startup") or {}
    if "total_s" in startup:
        parts = f"import {startup['import_s']}, engine {startup['engine_s']}"
        rows.append(["start-up of a fresh engine process (s)", f"{startup['total_s']} ({parts})"])
    if "total_s" in env:
        rows.append(["whole run (s)", env["total_s"]])
    sizes = results.get("sizes")
    if sizes:
        rows.append(["workload sizes", ", ".join(f"{k} {v}" for k, v in sizes.items())])
    return markdown_table(["", "this run"], rows)


def _figure(results: dict, w: str, system: str, key: str) -> Any:
    figs = report._get(results, "workloads", w, "systems", system)
    if figs is None:
        return "–"
    if "skipped" in figs:
        return "skipped"
    return figs.get(key, "–")


def _summary(results: dict) -> list[str]:
    present = [w for w, _, _ in SUMMARY if w in results["workloads"]]
    systems = [
        s
        for s in NAMES
        if any(report._get(results, "workloads", w, "systems", s) is not None for w in present)
    ]
    rows = []
    for w, key, label in SUMMARY:
        if w not in results["workloads"]:
            continue
        cells = [_figure(results, w, s, key) for s in systems]
        sgl, hf = _figure(results, w, "sgl_lite", key), _figure(results, w, "hf_alone", key)
        ratio: Any = "–"
        if isinstance(sgl, (int, float)) and isinstance(hf, (int, float)) and sgl and hf:
            ratio = f"{_cell(hf / sgl if key == 'wall_s' else sgl / hf)}x"
        batch = (results.get("sizes") or {}).get("decode_batch", "N")
        rows.append([label.format(batch=batch), *cells, ratio])
    if not rows:
        return []
    header = ["workload, figure", *(NAMES[s] for s in systems), "sgl_lite vs HF-alone"]
    return ["## Summary", "", *markdown_table(header, rows), ""]


def _targets(results: dict) -> list[str]:
    rows = [
        [t.figure, t.target, "–" if t.value is None else t.value, t.status]
        for t in report.evaluate_targets(results)
    ]
    intro = (
        "Marked by `bench/report.py` (`evaluate_targets`) on this file's figures; "
        "a target missed stays in the table as missed."
    )
    return [
        "## Targets",
        "",
        intro,
        "",
        *markdown_table(["figure", "target", "value", "status"], rows),
        "",
    ]


def _notes(w: str, block: dict) -> list[str]:
    notes = list(block.get("notes", []))
    for name, figs in block["systems"].items():
        if "skipped" in figs:
            notes.append(f"{name} skipped: {figs['skipped']}")
        if w == "W4" and "weights" in figs:
            notes.append(f"{name} weights: {figs['weights']}")
        notes += report.figure_notes(name, figs)
        diffs = figs.get("disagreements") or []
        if diffs:
            first = diffs[0]
            notes.append(
                f"{name} differs from hf_alone in {len(diffs)} turn(s), first: conversation "
                f"{first['conversation']} turn {first['turn']} at token {first['token']}"
            )
    return [f"- {n}" for n in notes]


def _workload(w: str, block: dict) -> list[str]:
    cols = report.WORKLOAD_COLUMNS.get(w) or sorted(
        {k for f in block["systems"].values() for k, v in f.items() if isinstance(v, (int, float))}
    )
    ratio = "hf_alone" in block["systems"]  # W3B, W3T and W5 compare other things
    rows = []
    for name, figs in block["systems"].items():
        if "skipped" in figs:
            rows.append([name, "skipped", *[""] * (len(cols) - 1 + ratio)])
            continue
        row = [name, *(figs.get(c, "") for c in cols)]
        if ratio:
            r = figs.get("ratio_vs_hf_alone")
            row.append(f"{_cell(r)}x" if isinstance(r, (int, float)) else "")
        rows.append(row)
    header = ["system", *cols, *(["vs HF-alone"] if ratio else [])]
    notes = _notes(w, block)
    return [
        f"## {w}: {block['title']}",
        "",
        *markdown_table(header, rows),
        "",
        *notes,
        *([""] if notes else []),
    ]


def regenerate_command(results_path: Path, out_path: Path) -> str:
    """The command that rewrites `out_path` from `results_path`."""
    if (results_path.resolve(), out_path.resolve()) == (DEFAULT_RESULTS, DEFAULT_OUT):
        return "python -m bench.docs_table"
    return f"python -m bench.docs_table --results {results_path} --out {out_path}"


def render(
    results: dict, *, source: str, regenerate: str, chart: bool, shapes: dict | None = None
) -> str:
    """The Markdown page for `results`; `source` is the JSON's path as the page links it,
    `regenerate` the command that rewrites the page, `chart` whether the PNG is beside it,
    `shapes` the model-shapes results where there are some."""
    head = [
        "# Performance",
        "",
        f"> Generated from [`{source}`]({source}) by `python -m bench.docs_table`; "
        f"do not edit: regenerate with `{regenerate}`.",
        "",
        "The results file was written by",
        "",
        "```bash",
        run_command(results),
        "```",
        "",
        "on this machine, as the file records it (the model is always the embedded "
        "SmolLM2-135M-Instruct, greedy):",
        "",
        *_environment(results),
        "",
    ]
    body = _summary(results)
    if chart:
        body += [
            "Speed over HF-alone, every system (log scale):",
            "",
            f"![bench ratios]({CHART})",
            "",
        ]
    for w, block in results["workloads"].items():
        body += _workload(w, block)
    body += _targets(results)  # after the workloads: a target's "n/a" points at their notes
    if shapes:
        body += _shapes(shapes)
    from bench.lm_eval_bench import DOCS_SECTION  # the lm-eval bench's row (issue 38)

    body += [DOCS_SECTION]
    return "\n".join([*head, *body, HOW]).rstrip() + "\n"


SHAPES = "model_shapes.json"  # `python -m bench.model_shapes --out`, beside the results file


def _shapes(shapes: dict) -> list[str]:
    """The models-users-bring section: `bench.model_shapes`' table of its results."""
    from bench.model_shapes import table

    return [
        "## Models of real shapes (GGUF) against llama-cpp-python",
        "",
        "Random-weight checkpoints of real models' sizes, converted and quantized by llama.cpp's "
        f"own tools, each system in its own process on the same file (from [`{SHAPES}`]"
        f"({SHAPES}), written by `python -m bench.model_shapes --out docs/{SHAPES}`; its "
        "module doc says how each figure is measured):",
        "",
        table(shapes),
        "",
        "Every file here has more than 512 MB of linears once dense, so sgl_lite runs it from "
        "the file's codes alone (docs/models.md): every pass on the onnxruntime graph. Every row "
        "comes from one run (2026-12-07, 2-core AVX512-BF16 EPYC, 2 threads, each system alone): "
        "batch-1 decode counts the decode steps alone on both sides, the prompt's pass apart, as "
        "llama-cpp-python's `eval` loop does; the first load writes the config (from our parse "
        "of the header) and the tokenizer: 0.2-0.6 s more than a later load. Where "
        "its decode trails, onnxruntime's profile puts ~94 % of the step in `MatMulNBits` (in "
        "that run the 4-bit q/k/v projection took float32 activations: ~6 ms of a Q4_0 1B "
        "step, ~4 ms more than the int8 ones it takes since); its prefill trails where the "
        "int8-activation GEMM at 512 rows is slower than a dense bf16 one "
        "(`SGL_LITE_DENSE_LINEARS=1` keeps a dense copy for it, at ~2 bytes a weight).",
        "",
    ]


def render_file(results_path: Path, out_path: Path) -> str:
    """The page `out_path` should hold for the results file at `results_path`."""
    results = json.loads(results_path.read_text())
    source = Path(os.path.relpath(results_path.resolve(), out_path.resolve().parent)).as_posix()
    chart = (results_path.parent / CHART).exists()
    shapes_path = results_path.parent / SHAPES
    shapes = json.loads(shapes_path.read_text()) if shapes_path.exists() else None
    return render(
        results,
        source=source,
        regenerate=regenerate_command(results_path, out_path),
        chart=chart,
        shapes=shapes,
    )


def write(results_path: Path, out_path: Path) -> str:
    """Writes the page for `results_path` to `out_path`; returns a line saying so."""
    out_path.write_text(render_file(results_path, out_path))
    return f"performance page: {out_path}"


def main(argv: list[str] | None = None) -> int:
    """Writes (or with --check, compares) the page; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m bench.docs_table", description=__doc__)
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="bench_results.json")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown page to write")
    p.add_argument("--check", action="store_true", help="exit 1 if --out is not up to date")
    args = p.parse_args(argv)
    if args.check:
        fresh = render_file(args.results, args.out)
        if not args.out.exists() or args.out.read_text() != fresh:
            print(f"{args.out} is stale: run {regenerate_command(args.results, args.out)}")
            return 1
        print(f"{args.out} is up to date")
        return 0
    print(write(args.results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

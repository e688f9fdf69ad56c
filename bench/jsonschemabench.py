"""`python -m bench.jsonschemabench`: JSONSchemaBench (arXiv:2501.10868) on a vendored sample.

For each schema of bench/data/jsonschemabench (see SOURCE.md there) and each grammar backend,
the paper's three figures (Geng et al. 2025, section 4; its evaluation code read, not copied):

- declared coverage: the engine's own path for a json_schema request accepts and compiles it,
  `GrammarCompiler.validate` then `.compile` with the engine's settings (as the engine's
  RequestBuilder does at submission); a refusal, or a compile over the timeout, scores 0;
- empirical coverage: one greedy output (`max_new_tokens` 512) through the in-process `Engine`,
  each sub-dataset's requests submitted together, that parses and validates (Draft 2020-12 with
  format checking, bench.jsonschemabench_eval.judge); anything else scores 0;
- compliance: empirical coverage over the declared schemas.

The prompt is the paper's instruction as a system message and the schema (`json.dumps`) as the
user message, through the model's chat template. NOTE: the paper also puts two worked
(schema, answer) examples per sub-dataset before the schema; they are not reproduced here.

Compiles run in a child process per backend, restarted after a timeout: a timed-out build
cannot be stopped and would slow the compiles measured after it. `--no-model` gives declared
coverage and compile times only. The scoring and the tables are in bench.jsonschemabench_eval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from bench.jsonschemabench_eval import (
    PAPER,
    checked_formats,
    compile_table,
    compile_times,
    coverage,
    coverage_table,
    group_refusals,
    judge,
    markdown_table,
    rescore,
)

DATA = Path(__file__).parent / "data" / "jsonschemabench"
# The paper's Table 4 order, then the two sub-datasets the table leaves out.
SUB_DATASETS = (
    "Glaiveai2K",
    "Github_easy",
    "Snowplow",
    "Github_medium",
    "Kubernetes",
    "WashingtonPost",
    "Github_hard",
    "JsonSchemaStore",
    "Github_trivial",
    "Github_ultra",
)
BACKENDS = ("auto", "outlines", "llguidance", "xgrammar")  # EngineConfig.grammar_backend
SYSTEM_PROMPT = "You need to generate a JSON object that matches the schema below."
_SPAWN = multiprocessing.get_context("spawn")
_READY = -1  # a compile worker's first message: tokenizer loaded, compiler built
STARTUP_S = 300.0  # the most a compile worker may take to start (imports, tokenizer, vocabulary)
_WARNING = re.compile(r"^\[[\d:]+\] \S+: ")  # xgrammar's "[time] file:line: " prefix


class Item(NamedTuple):
    """One schema of the sample: its sub-dataset, file name and text as vendored."""

    sub: str
    name: str
    text: str

    @property
    def schema(self) -> dict[str, Any]:
        return json.loads(self.text)

    @property
    def id(self) -> str:
        return f"{self.sub}/{self.name}"


class Declared(NamedTuple):
    """Declared coverage of one schema on one backend: whether it compiled within the timeout,
    how long validate + compile took, which backend built it, and the refusal if any."""

    ok: bool
    seconds: float
    chosen: str | None
    reason: str | None = None
    timed_out: bool = False
    notes: tuple[str, ...] = ()  # what the backend's native code logged (xgrammar's warnings)


def load_items(subs: list[str], limit: int | None = None) -> list[Item]:
    """The vendored schemas of `subs`, the first `limit` of each by file name."""
    items = []
    for sub in subs:
        files = sorted((DATA / sub).glob("*.json"))
        if not files:
            raise SystemExit(f"no schemas for sub-dataset {sub!r} under {DATA}")
        for path in files[:limit]:
            items.append(Item(sub, path.name, path.read_text(encoding="utf-8")))
    return items


def new_compiler(tokenizer: Any, backend: str, timeout_s: float) -> Any:
    """A GrammarCompiler built as the engine builds its own (engine/intake.RequestBuilder)."""
    from sgl_lite.backend.config import EngineConfig
    from sgl_lite.backend.constrained import GrammarCompiler

    config = EngineConfig(grammar_backend=backend, grammar_compile_timeout=timeout_s)
    return GrammarCompiler(
        tokenizer,
        whitespace_pattern=config.constrained_json_whitespace_pattern,
        timeout_s=config.grammar_compile_timeout,
        backend=config.grammar_backend,
    )


def declare(compiler: Any, text: str) -> Declared:
    """Declared coverage of one schema (its JSON text, as a request carries it): validate at
    submission, then the compile the request would wait for. A build that ends after the
    timeout counts as timed out whatever its result (the paper's 10 s compile timeout)."""
    from sgl_lite.backend.constrained import GrammarError

    start = time.perf_counter()
    try:
        compiler.validate("json_schema", text)
        grammar = compiler.compile("json_schema", text)
    except GrammarError as exc:
        seconds = time.perf_counter() - start
        return Declared(False, seconds, None, str(exc), "timed out" in str(exc))
    seconds = time.perf_counter() - start
    if seconds > compiler.timeout_s:
        reason = f"compile took {seconds:.1f} s, over the {compiler.timeout_s} s timeout"
        return Declared(False, seconds, grammar.backend, reason, True)
    return Declared(True, seconds, grammar.backend)


def _declare_worker(
    backend: str,
    jobs: list[tuple[int, str]],
    timeout_s: float,
    num_threads: int,
    model_path: str | None,
    out: Any,
) -> None:
    """Child process: puts (_READY, None) on `out` once its compiler is built, then compiles
    each (index, schema text) and puts (index, Declared)."""
    import torch

    torch.set_num_threads(num_threads)
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    compiler = new_compiler(load_tokenizer(resolve_model_path(model_path)), backend, timeout_s)
    out.put((_READY, None))
    for index, text in jobs:
        with tempfile.TemporaryFile() as log:
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)  # native code logs to fd 2: xgrammar says what it ignores
            try:
                decl = declare(compiler, text)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            lines = log.read().decode(errors="replace").splitlines()
        notes = dict.fromkeys(_WARNING.sub("", line).strip() for line in lines if line.strip())
        out.put((index, decl._replace(notes=tuple(notes)[:20])))


def declared_coverage(
    backend: str, items: list[Item], *, timeout_s: float, num_threads: int, model_path: str | None
) -> list[Declared]:
    """`declare` for every item on `backend`, in a child process that is replaced after each
    timeout; a child that dies or stays silent past twice the timeout (plus start-up) scores
    its current schema 0 and is replaced too."""
    results: dict[int, Declared] = {}
    pending = list(range(len(items)))
    while pending:
        out = _SPAWN.Queue()
        jobs = [(i, items[i].text) for i in pending]
        args = (backend, jobs, timeout_s, num_threads, model_path, out)
        proc = _SPAWN.Process(target=_declare_worker, args=args, daemon=True)
        proc.start()
        last = time.monotonic()
        ready = restart = False
        while pending and not restart:
            try:
                index, decl = out.get(timeout=1.0)
            except queue.Empty:
                waited = time.monotonic() - last
                if proc.is_alive() and waited < (2 * timeout_s + 10 if ready else STARTUP_S):
                    continue
                if not ready:
                    raise RuntimeError(f"the {backend} compile worker did not start") from None
                why = (
                    f"no answer in {waited:.0f} s"
                    if proc.is_alive()
                    else f"worker exited with code {proc.exitcode} while compiling"
                )
                index, decl, restart = pending[0], Declared(False, waited, None, why), True
            last = time.monotonic()
            if index == _READY:
                ready = True
                continue
            results[index] = decl
            pending.remove(index)
            restart = restart or decl.timed_out
        proc.kill()
        proc.join()
    return [results[i] for i in range(len(items))]


# --- empirical coverage: the model ------------------------------------------------------------
def prompt_ids(tokenizer: Any, schema: dict[str, Any]) -> list[int]:
    """The paper's instruction and the schema through the chat template, as token ids."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": json.dumps(schema)},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


async def _generate_all(engine: Any, requests: list[dict[str, Any]]) -> list[Any]:
    """Every request at once (a user's concurrent calls); an exception stands for its result."""
    calls = [engine.async_generate(**r) for r in requests]
    return list(await asyncio.gather(*calls, return_exceptions=True))


def _outcome(item: Item, result: Any) -> dict[str, Any]:
    """One request's result (or the exception its call raised) as a scored record."""
    from sgl_lite.backend.errors import InvalidRequest

    if isinstance(result, InvalidRequest):
        if result.field == "json_schema":
            status = "refused"
        elif "context length" in result.message or "KV pool" in result.message:
            status = "prompt_too_long"
        else:
            status = "error"
        return {"status": status, "reason": result.message}
    if isinstance(result, BaseException):
        return {"status": "error", "reason": f"{type(result).__name__}: {result}"}
    meta = result["meta_info"]
    finish = meta.get("finish_reason") or {}
    record: dict[str, Any] = {
        "finish_reason": finish.get("type"),
        "completion_tokens": meta.get("completion_tokens"),
        "prompt_tokens": meta.get("prompt_tokens"),
        "engine_violation": meta.get("constraint_violation"),
        "text": result["text"][:2000],
    }
    if finish.get("type") == "abort":  # the grammar failed to compile or timed out
        return {**record, "status": "refused", "reason": finish.get("message")}
    verdict = judge(result["text"], item.schema)
    return {**record, "status": verdict.status, "reason": verdict.reason}


def empirical_coverage(
    backend: str,
    items: list[Item],
    *,
    max_new_tokens: int,
    num_threads: int,
    model_path: str | None,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """One greedy output per item on a fresh engine with `backend`, each sub-dataset's requests
    submitted together; a scored record per item (see `_outcome`)."""
    from sgl_lite.backend.engine import Engine

    engine = Engine(
        model_path,
        num_threads=num_threads,
        grammar_backend=backend,
        grammar_compile_timeout=timeout_s,
        log_level="warning",
    )
    records: list[dict[str, Any]] = []
    try:
        for sub in dict.fromkeys(i.sub for i in items):
            group = [i for i in items if i.sub == sub]
            requests = [
                {
                    "input_ids": prompt_ids(engine.tokenizer, i.schema),
                    "sampling_params": {
                        "temperature": 0,
                        "max_new_tokens": max_new_tokens,
                        "json_schema": i.text,
                    },
                }
                for i in group
            ]
            start = time.perf_counter()
            results = asyncio.run(_generate_all(engine, requests))
            wall = time.perf_counter() - start
            print(f"  {backend} {sub}: {len(group)} requests in {wall:.1f} s", flush=True)
            records += [_outcome(i, r) for i, r in zip(group, results)]
    finally:
        engine.shutdown()
    return records


# --- the run -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.jsonschemabench", description=__doc__)
    p.add_argument("--sub-datasets", default=",".join(SUB_DATASETS))
    p.add_argument("--limit", type=int, help="schemas per sub-dataset (first N by file name)")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--no-model", action="store_true", help="declared coverage and compile times")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--compile-timeout", type=float, default=10.0, help="seconds (the paper's)")
    p.add_argument("--model-path", help="default: the embedded SmolLM2")
    p.add_argument("--out", default="jsonschemabench_results.json")
    p.add_argument("--rescore", help="judge a saved run's outputs again (no model), into --out")
    args = p.parse_args(argv)
    for name, known in (("sub_datasets", SUB_DATASETS), ("backends", BACKENDS)):
        values = [v for v in getattr(args, name).split(",") if v]
        unknown = sorted(set(values) - set(known))
        if unknown:
            p.error(f"unknown {name.replace('_', '-')} {unknown}; known: {', '.join(known)}")
        setattr(args, name, values)
    return args


def run_backend(backend: str, items: list[Item], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every item's record on one backend: declared coverage, then (with the model) its output."""
    start = time.perf_counter()
    decls = declared_coverage(
        backend,
        items,
        timeout_s=args.compile_timeout,
        num_threads=args.num_threads,
        model_path=args.model_path,
    )
    print(f"{backend}: declared pass in {time.perf_counter() - start:.0f} s", flush=True)
    records = [
        {
            "sub": i.sub,
            "schema": i.name,
            "backend": backend,
            "declared": d.ok,
            "compile_s": round(d.seconds, 4),
            "chosen": d.chosen,
            "timed_out": d.timed_out,
            "refusal": d.reason,
            "compile_notes": list(d.notes),
        }
        for i, d in zip(items, decls)
    ]
    if not args.no_model:
        # NOTE: the engine in its own process, so no compile it timed out outlives it here.
        with ProcessPoolExecutor(1, mp_context=_SPAWN) as pool:
            outputs = pool.submit(
                empirical_coverage,
                backend,
                items,
                max_new_tokens=args.max_new_tokens,
                num_threads=args.num_threads,
                model_path=args.model_path,
                timeout_s=args.compile_timeout,
            ).result()
        for record, output in zip(records, outputs):
            record.update(output)
    return records


def rescore_file(path: str, out: str) -> dict[str, Any]:
    """`--rescore`: a saved run judged again with this module's judge, its tables printed."""
    result = json.loads(Path(path).read_text())
    schemas = {
        f"{r['sub']}/{r['schema']}": json.loads((DATA / r["sub"] / r["schema"]).read_text())
        for r in result["records"]
    }
    changed = rescore(result, schemas)
    result["environment"]["formats_checked"] = checked_formats()
    print(f"{changed} verdicts changed")
    for backend in result["summary"]:
        print(f"\n{backend}, for docs/constraints.md:\n" + markdown_table(result, backend))
    Path(out).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.rescore:
        return rescore_file(args.rescore, args.out)
    items = load_items(args.sub_datasets, args.limit)
    print(
        f"JSONSchemaBench sample: {len(items)} schemas from {len(args.sub_datasets)} "
        f"sub-datasets, backends {', '.join(args.backends)}; num_threads={args.num_threads}, "
        f"compile timeout {args.compile_timeout} s, "
        + ("no model" if args.no_model else f"max_new_tokens={args.max_new_tokens}"),
        flush=True,
    )
    records: list[dict[str, Any]] = []
    for backend in args.backends:
        records += run_backend(backend, items, args)
    summary = {
        b: {
            s: coverage([r for r in records if r["backend"] == b and r["sub"] == s])
            for s in args.sub_datasets
        }
        for b in args.backends
    }
    times = {b: compile_times([r for r in records if r["backend"] == b]) for b in args.backends}
    refusals = {
        b: group_refusals(
            (f"{r['sub']}/{r['schema']}", r["refusal"])
            for r in records
            if r["backend"] == b and r["refusal"]
        )
        for b in args.backends
    }
    print("\n" + coverage_table(summary, args.backends))
    print(f"paper: {PAPER}")
    print("\ncompile (validate + compile, seconds; p50/p95 over the accepted schemas)")
    print(compile_table(times))
    print("\nrefusals by keyword")
    for backend, groups in refusals.items():
        print(f"  {backend}: " + ", ".join(f"{g['keyword']} {g['count']}" for g in groups))
    for backend, t in times.items():
        if t["notes"]:
            print(f"\n{backend} compiled {t['accepted_with_notes']} schemas with warnings:")
            for note, count in sorted(t["notes"].items(), key=lambda kv: -kv[1])[:6]:
                print(f"  {count:>4}x {note[:150]}")
    result = {
        "args": {k: v for k, v in vars(args).items()},
        "environment": {
            "num_threads": args.num_threads,
            "python": sys.version.split()[0],
            "validator": "Draft202012Validator + FormatChecker",
            "formats_checked": checked_formats(),
            "cpu_count": os.cpu_count(),
        },
        "paper": PAPER,
        "summary": summary,
        "compile": times,
        "refusals": refusals,
        "records": records,
    }
    if not args.no_model:
        for backend in args.backends:
            print(f"\n{backend}, for docs/constraints.md:\n" + markdown_table(result, backend))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()

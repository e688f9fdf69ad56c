"""SGLang's own serving benchmark (`python -m sglang.bench_serving`) against our server and peers.

    python -m bench.serving                                  # sgl_lite, both datasets
    python -m bench.serving --peers sgl_lite,vllm --datasets generated-shared-prefix

`make bench-serving` builds `.venv-bench-serving`: SGLang 0.4.10's client alone (`--no-deps`),
reading everything else it imports (aiohttp, numpy, transformers) from `.venv`. 0.4.10 is the
newest release whose `bench_serving` imports without SGLang's server stack: 0.5.x's pulls in
the multimodal model configs and with them torchvision, whose PyPI build does not load beside
the CPU torch ("operator torchvision::nms does not exist").

Each system is started on loopback, alone on the machine, with the same thread count, then
driven by the unmodified tool over its datasets:
- `generated-shared-prefix`: a few synthetic system prompts, each shared by many questions (the
  RadixAttention workload: every question after the first reuses its group's prefix);
- `random-ids`: random token ids, no reuse.
Both send token counts, not text we chose, so the figures are the tool's own: request and
output throughput, TTFT and inter-token latency percentiles. One JSON line per system and
dataset goes to stdout; `--table` prints them as a markdown table as well.

Peers: `sgl_lite` (our server, `--backend sglang`: native `/generate`, streamed) and `vllm`
(vLLM's CPU build's OpenAI server in `.venv-vllm`, `--backend vllm`: `/v1/completions`,
streamed, bf16 where the CPU has a bf16 GEMM, compiled, prefix caching on: its best mode).
A peer that cannot start is reported skipped with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.common import Skipped
from bench.hf_baselines import dense_checkpoint
from bench.run import vllm_dtype
from bench.vllm_peer import VENV_PYTHON as VLLM_PYTHON
from bench.vllm_peer import worker_env
from sgl_lite.backend.runner.model_loader import resolve_model_path
from sgl_lite.cluster import free_port, stop_all

ROOT = Path(__file__).resolve().parent.parent
TOOL_PYTHON = ROOT / ".venv-bench-serving" / "bin" / "python"
START_TIMEOUT_S = {"sgl_lite": 300.0, "vllm": 1200.0}  # vLLM compiles its model at start-up
RUN_TIMEOUT_S = 1800.0

# The tool's arguments per dataset: sized so one run takes a minute or two on 2 cores.
DATASETS: dict[str, list[str]] = {
    "generated-shared-prefix": [
        "--gsp-num-groups", "4",
        "--gsp-prompts-per-group", "16",
        "--gsp-system-prompt-len", "512",
        "--gsp-question-len", "64",
        "--gsp-output-len", "32",
    ],
    "random-ids": [
        "--num-prompts", "32",
        "--random-input-len", "256",
        "--random-output-len", "32",
        "--random-range-ratio", "1.0",
    ],
}  # fmt: skip
BACKENDS = {"sgl_lite": "sglang", "vllm": "vllm"}
# The figures read from the tool's JSON line (0.4.10's names), in the table's order.
FIGURES = (
    "completed",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "duration",
)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """Until `url`/v1/models answers; Skipped (with the end of `log`) if the server process
    exits or time runs out. bench/lm_eval_bench.py starts its servers with it too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise Skipped(f"the server exited with status {proc.returncode}: {tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise Skipped(f"the server did not answer within {timeout:.0f} s")


def sgl_lite_command(port: int, threads: int, *flags: str) -> tuple[list[str], None]:
    """Our server's command line on `port` (and its environment: ours), with extra `flags`."""
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--port", str(port)]
    return [*cmd, "--num-threads", str(threads), "--log-level", "warning", *flags], None


def vllm_command(
    port: int, threads: int, model: Path, *flags: str
) -> tuple[list[str], dict[str, str]]:
    """vLLM CPU's OpenAI server on `port` over `model`'s dense checkpoint (its dtype, prefix
    caching on, served as "default"), with extra `flags`, and its environment."""
    if not VLLM_PYTHON.exists():
        raise Skipped(f"{VLLM_PYTHON} is missing: `make bench-vllm` builds it")
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", str(dense_checkpoint(model)), "--dtype", vllm_dtype("auto")]
    cmd += ["--port", str(port), "--enable-prefix-caching", "--served-model-name", "default"]
    return [*cmd, *flags], worker_env(threads)


@contextlib.contextmanager
def launched(
    cmd: list[str], env: dict[str, str] | None, port: int, timeout: float, log: Path
) -> Iterator[str]:
    """Runs `cmd` (output to `log`) until its server on `port` answers; yields its URL;
    stops it."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, timeout, log)
        yield url
    finally:
        stop_all([proc], timeout=30)


@contextlib.contextmanager
def server(peer: str, threads: int, model: Path, log: Path) -> Iterator[str]:
    """Starts `peer`'s server on loopback; yields its URL; stops it."""
    port = free_port()
    if peer == "sgl_lite":
        cmd, env = sgl_lite_command(port, threads)
    elif peer == "vllm":
        cmd, env = vllm_command(port, threads, model)
    else:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(BACKENDS)}")
    with launched(cmd, env, port, START_TIMEOUT_S[peer], log) as url:
        yield url


def run_tool(peer: str, url: str, dataset: str, tokenizer: Path, work: Path) -> dict:
    """One `sglang.bench_serving` run; its JSON line's figures."""
    if not TOOL_PYTHON.exists():
        raise SystemExit(f"{TOOL_PYTHON} is missing: `make bench-serving` builds it")
    out = work / f"{peer}-{dataset}.jsonl"
    cmd = [str(TOOL_PYTHON), "-m", "sglang.bench_serving", "--backend", BACKENDS[peer]]
    cmd += ["--base-url", url, "--dataset-name", dataset, "--tokenizer", str(tokenizer)]
    cmd += ["--model", "default", "--output-file", str(out), "--disable-tqdm", "--seed", "1"]
    cmd += ["--request-rate", "inf", *DATASETS[dataset]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode or not out.exists():
        raise Skipped(f"bench_serving exited {done.returncode}: {done.stderr[-1500:]}")
    line = json.loads(out.read_text().splitlines()[-1])
    return {k: round(line[k], 2) for k in FIGURES if k in line}


def table(rows: list[dict]) -> str:
    """The rows as a markdown table, one row per system and dataset."""
    head = ["dataset", "system", *FIGURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["dataset"], row["system"]]
        cells += [str(row.get(k, row.get("skipped", "–"))) for k in FIGURES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", default="sgl_lite", help="comma-separated: sgl_lite, vllm")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--table", action="store_true", help="also print a markdown table")
    args = parser.parse_args()
    model = resolve_model_path(None)  # the embedded SmolLM2: config and tokenizer folder
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        for peer in args.peers.split(","):
            try:
                with server(peer, args.num_threads, model, work / f"{peer}.log") as url:
                    for dataset in args.datasets.split(","):
                        figures = run_tool(peer, url, dataset, model, work)
                        rows.append({"system": peer, "dataset": dataset, **figures})
                        print(json.dumps(rows[-1]), flush=True)
            except Skipped as why:
                rows.append({"system": peer, "dataset": args.datasets, "skipped": str(why)})
                print(json.dumps(rows[-1]), flush=True)
    if args.table:
        print(table(rows))


if __name__ == "__main__":
    main()

"""vLLM's CPU build as a peer: `bench/vllm_worker.py` in `.venv-vllm`'s own Python.

vLLM pins its own torch and transformers, so it cannot share sgl_lite's venv; `make bench-vllm`
builds `.venv-vllm`, and this class drives vLLM's offline `LLM` API (prefix caching on) there in
a subprocess over JSON lines. It gets the same token ids as every system (the tokenizer runs
here) and the embedded model's weights as a float32 folder (`hf_baselines.dense_checkpoint`),
so vLLM computes on the weights the `sgl_lite_float32` row computes on, in the dtype
`bench.run` gives it (`--vllm-dtype`; by default bf16 where the CPU has a bf16 GEMM: its best
mode there). A missing venv, a failed start or a crash is `Skipped` with the reason (the exit
status or signal and the end of the worker's stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from bench.common import (
    ChatRun,
    SelectItem,
    Skipped,
    decide,
    eos_ids,
    json_figures,
    json_prompt_ids,
    raw_ids,
    select_items,
    strip_eos,
)
from bench.workloads import Workloads
from sgl_lite.backend import omp_policy

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
# Model load plus vLLM's start-up: torch.compile of the model takes 3-6 min on 2 loaded cores,
# every start (vLLM 0.32's compile cache fails to load beside torch 2.13); eager mode ~1 min.
START_TIMEOUT_S = 900.0
CALL_TIMEOUT_S = 1800.0
KV_CACHE_GIB = 2  # SmolLM2-135M: 30 layers x 3 KV heads x 64 x 2 x 4 B = 90 KiB a token


def worker_env(
    num_threads: int, base: dict[str, str] | None = None, preload: Path | None = None
) -> dict[str, str]:
    """The worker's environment: vLLM's CPU knobs set to `num_threads` cores, nothing of ours.

    VLLM_CPU_OMP_THREADS_BIND pins one OpenMP thread per listed core (its default, "auto",
    takes a whole NUMA node, every core of this shared machine); the KV pool is sized in GiB by
    VLLM_CPU_KVCACHE_SPACE. The engine core runs in the worker's own process (V1
    multiprocessing off), so the one process holds the threads we asked for. PYTHONPATH and
    VIRTUAL_ENV are dropped so that nothing of sgl_lite's venv leaks into vLLM's. `preload`
    (the venv's Intel OpenMP, which vLLM's CPU docs ask to be preloaded) goes in LD_PRELOAD.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _NOT_PASSED}
    # Nor the OpenMP wait policy sgl_lite set for its own engine (omp_policy): vLLM's users
    # run it with its own defaults.
    for key, value in omp_policy.variables_set().items():
        if env.get(key) == value:
            del env[key]
    env.update(
        {
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{num_threads - 1}" if num_threads > 1 else "0",
            "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
            "OMP_NUM_THREADS": str(num_threads),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    if preload is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(preload), env.get("LD_PRELOAD", "")]))
    return env


_NOT_PASSED = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}


def _iomp(python: Path) -> Path | None:
    """The Intel OpenMP library of the venv `python` belongs to, if it has one."""
    lib = python.parent.parent / "lib" / "libiomp5.so"
    return lib if lib.exists() else None


def parse_reply(line: str) -> dict[str, Any]:
    """One reply line as a dict; a line that is not a JSON object is a protocol error."""
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise RuntimeError(f"vllm worker sent a line that is not JSON: {line[:200]!r}") from exc
    if not isinstance(message, dict):
        raise RuntimeError(f"vllm worker sent {type(message).__name__}, not an object")
    return message


def exit_reason(code: int | None) -> str:
    """How the worker ended, as the report says it."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def log_tail(text: str, lines: int = 3) -> str:
    """The last non-blank lines of the worker's stderr, joined for one report cell."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def cache_figures(prompts: list[list[int]], outputs: list[dict]) -> tuple[int, int]:
    """(prompt tokens submitted, prompt tokens computed) from the prompts and vLLM's replies."""
    submitted = sum(len(p) for p in prompts)
    cached = sum(int(o.get("cached") or 0) for o in outputs)
    return submitted, submitted - cached


def choice_scores(items: list[SelectItem], outputs: list[dict]) -> list[list[list[float]]]:
    """The worker's flat "score" outputs (every item's choices in order) regrouped as
    scores[item][choice] = the choice tokens' logprobs, what `decide` takes."""
    sizes = [len(it.choices) for it in items]
    if len(outputs) != sum(sizes):
        raise RuntimeError(f"vllm scored {len(outputs)} prompts, {sum(sizes)} were sent")
    scores, at = [], 0
    for item, n in zip(items, sizes):
        group = [list(map(float, o["logprobs"])) for o in outputs[at : at + n]]
        for choice, logprobs in zip(item.choices, group):
            if len(logprobs) != len(choice.ids) - choice.start:
                raise RuntimeError(
                    f"vllm returned {len(logprobs)} logprobs for a "
                    f"{len(choice.ids) - choice.start}-token choice"
                )
        scores.append(group)
        at += n
    return scores


# The two ways W2 asks vLLM for prompt logprobs: its default, and prefix-cache reads on.
W2_MODES = {"no_cache_reads": False, "cache_reads": True}


def w2_cache_note(runs: dict[str, dict[str, Any]], chosen: str) -> str:
    """What vLLM's prefix cache did for W2's prompt-logprob requests, for the report."""
    parts = [
        f"{mode} {run['wall_s']:.3g} s, {run['computed']} of {run['submitted']} prompt "
        f"tokens computed" + (f", {run['rescored']} rescored" if run.get("rescored") else "")
        for mode, run in runs.items()
    ]
    return (
        "vLLM 0.32 reads no prefix cache for a request asking for prompt_logprobs (its "
        "SamplingParams.skip_reading_prefix_cache defaults to True then); with it set to False "
        "the logprobs past the cache hit are fresh, a choice the hit reaches is rescored "
        f"without reads. {'; '.join(parts)}; the figure is the faster ({chosen})"
    )


class VllmPeer:
    """vLLM (CPU build) in its own venv's Python; W1-W4 go to it as JSON requests."""

    name = "vllm"

    def __init__(
        self,
        num_threads: int,
        tokenizer: Any,
        model_folder: Path,
        python: Path | str = VENV_PYTHON,
        worker: Path | str = WORKER,
        dtype: str = "float32",
        eager: bool = False,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        if not Path(python).exists():
            raise Skipped(f"{python} not found; `make bench-vllm` installs vLLM's CPU build")
        self.tokenizer, self.dtype = tokenizer, dtype
        self.mode = "eager" if eager else "torch.compile"
        self.eos = eos_ids(tokenizer)
        self._log = Path(tempfile.mkstemp(prefix="bench-vllm-", suffix=".log")[1])
        self._log_file = self._log.open("w")
        self._proc = subprocess.Popen(
            [str(python), str(worker), str(model_folder), dtype, "eager" if eager else "compiled"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=worker_env(num_threads, preload=_iomp(Path(python))),
            text=True,
        )
        self._dead: str | None = None
        try:
            hello = self._receive("start-up", start_timeout)
        except Skipped:
            self.shutdown()  # a crash or a timeout at start-up: reap it, close the log
            raise
        if "error" in hello or not hello.get("ready"):
            reason = hello.get("error", hello)
            self.shutdown()
            raise Skipped(f"vllm could not start: {reason}; log {self._log}")
        self.version = str(hello.get("version"))

    # --- the pipe -------------------------------------------------------------------------------
    def _crash(self, during: str) -> Skipped:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        self._log_file.flush()
        tail = log_tail(self._log.read_text(errors="replace"))
        self._dead = f"vllm crashed during {during} ({exit_reason(self._proc.poll())})" + (
            f": {tail}" if tail else ""
        )
        return Skipped(self._dead)

    def _receive(self, during: str, timeout: float) -> dict[str, Any]:
        out: IO[str] = self._proc.stdout  # type: ignore[assignment]
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            self._proc.kill()
            self._dead = f"vllm did not answer within {timeout:.0f}s ({during})"
            raise Skipped(self._dead)
        line = out.readline()
        if not line:
            raise self._crash(during)
        return parse_reply(line)

    def _request(self, during: str, **request: Any) -> dict[str, Any]:
        if self._dead:
            raise Skipped(self._dead)
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            raise self._crash(during) from None
        reply = self._receive(during, CALL_TIMEOUT_S)
        if not reply.get("ok"):
            raise RuntimeError(f"vllm {during}: {reply.get('error', reply)}")
        return reply

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        ignore_eos: bool = False,
        json_schema: dict | None = None,
    ) -> dict[str, Any]:
        """One `LLM.generate` call on token-id prompts (greedy); the worker's reply."""
        return self._request(
            "generate",
            op="generate",
            prompts=prompts,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            json_schema=json_schema,
        )

    def score(
        self, prompts: list[list[int]], starts: list[int], cache_reads: bool = False
    ) -> dict[str, Any]:
        """One `LLM.generate` call for the prompt logprobs of each prompt[start:]; the reply."""
        return self._request(
            "score", op="score", prompts=prompts, starts=starts, cache_reads=cache_reads
        )

    def _fresh(self) -> None:
        self._request("reset", op="reset")

    # --- the workloads --------------------------------------------------------------------------
    def warmup(self) -> None:
        """One short request, so no timing pays for vLLM's first-call set-up. A crash here is
        kept (each workload then reports it), not raised: the bench's set-up goes on."""
        with contextlib.suppress(Skipped):
            self.generate([[1, 2, 3]], 2)
            self.score([[1, 2, 3]], [1])  # and the prompt-logprob path W2 takes

    def w1(self, wl: Workloads) -> dict[str, Any]:
        """Each turn's conversations in one call (as sgl_lite submits them); cache hits from
        vLLM's own count of prompt tokens its prefix cache served."""
        self._fresh()
        run = ChatRun(self.tokenizer, wl)
        submitted = computed = 0
        ttft_measured = True
        start = time.perf_counter()
        for _ in range(run.num_turns):
            prompts = [run.prompt(c) for c in range(len(wl.conversations))]
            reply = self.generate(prompts, wl.chat_max_new_tokens)
            sub, comp = cache_figures(prompts, reply["outputs"])
            submitted, computed = submitted + sub, computed + comp
            for c, out in enumerate(reply["outputs"]):
                ttft = out.get("ttft_s")
                ttft_measured = ttft_measured and ttft is not None
                run.record(
                    c, strip_eos(out["ids"], self.eos), reply["wall_s"] if ttft is None else ttft
                )
        figures = run.figures(time.perf_counter() - start, computed=computed, submitted=submitted)
        if not ttft_measured:
            figures["ttft_note"] = "no first-token time from vLLM: the turn's whole call instead"
        return figures

    def w2(self, wl: Workloads) -> dict[str, Any]:
        """Every choice of every question in one call (sgl_lite submits them together too):
        each choice's whole prompt prefilled once for its prompt logprobs, scored as the
        llama-cpp peer's (`decide`: mean logprob of the choice tokens). Run in each of
        `W2_MODES` from an empty cache; the faster is the figure, both are kept."""
        _, items = select_items(self.tokenizer, wl)
        prompts = [c.ids for it in items for c in it.choices]
        starts = [c.start for it in items for c in it.choices]
        runs: dict[str, dict[str, Any]] = {}
        for mode, cache_reads in W2_MODES.items():
            self._fresh()
            reply = self.score(prompts, starts, cache_reads)
            submitted, computed = cache_figures(prompts, reply["outputs"])
            decisions = [decide(s)[0] for s in choice_scores(items, reply["outputs"])]
            runs[mode] = {
                "wall_s": reply["wall_s"],
                "decisions": decisions,
                "submitted": submitted,
                "computed": computed,
                "rescored": reply.get("rescored", 0),
            }
        chosen = min(runs, key=lambda m: runs[m]["wall_s"])
        best = runs[chosen]
        agree = len({tuple(run["decisions"]) for run in runs.values()}) == 1
        return {
            "wall_s": best["wall_s"],
            "decisions": best["decisions"],
            "accuracy": sum(d == it.answer for d, it in zip(best["decisions"], items)) / len(items),
            "prompt_tokens_submitted": best["submitted"],
            "prompt_tokens_computed": best["computed"],
            **{f"wall_s_{mode}": run["wall_s"] for mode, run in runs.items()},
            "decisions_agree_across_modes": agree,
            "cache_note": w2_cache_note(runs, chosen),
        }

    def w3(self, wl: Workloads) -> dict[str, Any]:
        """Every product in one call under vLLM's structured outputs (its JSON-schema mode)."""
        self._fresh()
        prompts = [json_prompt_ids(self.tokenizer, wl, p) for p in wl.products]
        # the schema's grammar is compiled on first use: once outside the timing
        self.generate(prompts[:1], 1, json_schema=wl.json_schema)
        self._fresh()
        reply = self.generate(prompts, wl.json_max_new_tokens, json_schema=wl.json_schema)
        texts = [o["text"] for o in reply["outputs"]]
        return json_figures(reply["wall_s"], texts, wl.json_schema)

    def w4(self, wl: Workloads) -> dict[str, Any]:
        """Batch-1 decode, then every W4 prompt in one call; EOS ignored, as for sgl_lite.
        Prefill as sgl_lite's: the prompts joined as one, from an empty cache, one new token."""
        self._fresh()
        one = self.generate(
            [raw_ids(self.tokenizer, wl.decode_prompt)], wl.decode_new_tokens_b1, True
        )
        self._fresh()
        many = [raw_ids(self.tokenizer, p) for p in wl.decode_prompts]
        batch = self.generate(many, wl.decode_new_tokens_batch, True)
        tokens_n = sum(len(o["ids"]) for o in batch["outputs"])
        self._fresh()
        joined = [t for ids in many for t in ids]
        prefill = self.generate([joined], 1)
        return {
            "prefill_tokens": len(joined),
            "prefill_tokens_per_s": len(joined) / prefill["wall_s"],
            "batch1_tokens_per_s": len(one["outputs"][0]["ids"]) / one["wall_s"],
            "batch_tokens_per_s": tokens_n / batch["wall_s"],
            "batch_size": len(many),
            "batch1_wall_s": one["wall_s"],
            "batch_wall_s": batch["wall_s"],
            "weights": f"vllm {self.version}, {self.dtype} HF folder, {self.mode}",
        }

    def shutdown(self) -> None:
        """Asks the worker to quit, then kills it if it lingers."""
        if self._proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")  # type: ignore[union-attr]
                self._proc.stdin.flush()  # type: ignore[union-attr]
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._log_file.close()

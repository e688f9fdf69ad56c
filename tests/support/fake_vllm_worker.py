"""bench/vllm_worker.py over a stand-in `vllm` module, so the peer's protocol is tested without
vLLM: `python fake_vllm_worker.py MODE dtype`.

The stand-in `LLM` answers greedily with a fixed rule (each new token is the prompt's last one
plus one), keeps a prefix cache of whole earlier prompts (what vLLM's counts would report), and
writes to stdout the way vLLM's logging and C code do, so a stray line in the replies would show.
Prompt logprobs follow a fixed rule too (`fake_logprob`); with cache reads on, the positions
the cache served hold a stale value, as vLLM's do. MODE: "ok", "fail-start" (the LLM
constructor raises), "segv" (a prompt holding 666 kills the process by SIGSEGV, as a C
kernel would).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
EOS = 2


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def fake_logprob(token: int) -> float:
    """The stand-in's logprob of prompt token `token`, whatever came before it."""
    return -((token * 7) % 11) / 10


STALE = 5.0  # what a cached position's "logprob" holds


class StructuredOutputsParams:
    def __init__(self, json: Any = None) -> None:
        self.json = json


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        print("INFO vllm is loading", model)  # vLLM logs to stdout
        os.write(1, b"C code noise\n")
        if model == "fail-start":
            raise RuntimeError("no CPU kernels for this ISA")
        self.mode, self.kwargs, self.seen = model, kwargs, []

    def reset_prefix_cache(self) -> bool:
        self.seen = []
        return True

    def _cached(self, ids: list[int]) -> int:
        best = 0
        for old in self.seen:
            n = 0
            while n < min(len(old), len(ids)) and old[n] == ids[n]:
                n += 1
            best = max(best, n)
        return best

    def generate(self, prompts: list[dict], params: SamplingParams, use_tqdm: bool) -> list:
        print("INFO generating", len(prompts))
        results = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            if self.mode == "segv" and 666 in ids:
                os.kill(os.getpid(), signal.SIGSEGV)
            reads = not getattr(params, "skip_reading_prefix_cache", False)
            cached = min(self._cached(ids), len(ids) - 1) if reads else 0
            self.seen.append(ids)
            prompt_logprobs = None
            if getattr(params, "prompt_logprobs", None) is not None:
                prompt_logprobs = [None] + [
                    {t: types.SimpleNamespace(logprob=STALE if i <= cached else fake_logprob(t))}
                    for i, t in enumerate(ids[1:], 1)
                ]
            if getattr(params, "structured_outputs", None) is not None:
                out, text = [7, 8], json.dumps({"name": "x", "schema": "given"})
            else:
                out = [(ids[-1] + 1 + i) % 50 for i in range(params.max_tokens)]
                if not getattr(params, "ignore_eos", False) and EOS in out:
                    out = out[: out.index(EOS) + 1]
                text = " ".join(map(str, out))
            completion = types.SimpleNamespace(token_ids=out, text=text)
            results.append(
                types.SimpleNamespace(
                    outputs=[completion],
                    num_cached_tokens=cached,
                    metrics=None,
                    prompt_logprobs=prompt_logprobs,
                )
            )
        return results


def install() -> None:
    """Puts the stand-in in sys.modules as `vllm` and `vllm.sampling_params`."""
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams, vllm.__version__ = LLM, SamplingParams, "0.0-fake"
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.StructuredOutputsParams = StructuredOutputsParams
    vllm.sampling_params = sampling
    sys.modules.update({"vllm": vllm, "vllm.sampling_params": sampling})


if __name__ == "__main__":
    install()
    from bench import vllm_worker

    sys.exit(vllm_worker.main(sys.argv[1:]))

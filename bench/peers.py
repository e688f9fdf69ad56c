"""Optional peers, run only where importable: llama-cpp-python (same GGUF) and outlines (W3).

Neither is a dependency of sgl_lite (`make bench-peers` installs them). A peer that is missing,
or that cannot run a workload, raises `Skipped` with the reason the report prints.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.common import (
    ChatRun,
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
from sgl_lite.common import common_prefix_len


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise Skipped(
            f"{module} not importable ({type(exc).__name__}: {exc}); `make bench-peers` installs it"
        ) from exc


class LlamaCpp:
    """llama-cpp-python on the embedded GGUF: one persistent `Llama` with a RAM prompt cache."""

    name = "llama_cpp"

    def __init__(self, num_threads: int, tokenizer: Any) -> None:
        llama_cpp = _require("llama_cpp")
        from sgl_lite.backend.runner.model_loader import embedded_gguf_path

        self.lib, self.tokenizer = llama_cpp, tokenizer
        self.eos = eos_ids(tokenizer)
        kwargs = {
            "model_path": str(embedded_gguf_path()),
            "n_ctx": 4096,
            "n_threads": num_threads,
            "n_batch": 512,
            "verbose": False,
        }
        self.llm = llama_cpp.Llama(**kwargs)
        # NOTE: W2 reads logits at every prompt position; only its own instance pays for that.
        self.scorer = llama_cpp.Llama(**kwargs, logits_all=True)
        self.grammar_cls = llama_cpp.LlamaGrammar

    def warmup(self) -> None:
        self.llm.create_completion([1, 2, 3], max_tokens=2, temperature=0)

    def shutdown(self) -> None:
        for llm in (self.llm, self.scorer):
            if hasattr(llm, "close"):
                llm.close()

    def _fresh(self) -> None:
        self.llm.reset()
        self.llm.set_cache(self.lib.LlamaRAMCache(capacity_bytes=2 << 30))

    def w1(self, wl: Workloads) -> dict[str, Any]:
        self._fresh()
        run = ChatRun(self.tokenizer, wl)
        start = time.perf_counter()
        for _ in range(run.num_turns):
            for c in range(len(wl.conversations)):
                ids = run.prompt(c)
                sent, first, out = time.perf_counter(), None, []
                for chunk in self.llm.create_completion(
                    ids, max_tokens=wl.chat_max_new_tokens, temperature=0, stream=True
                ):
                    first = first or time.perf_counter() - sent
                    out.append(chunk["choices"][0]["text"])
                text_ids = self.tokenizer.encode("".join(out), add_special_tokens=False)
                run.record(c, strip_eos(text_ids, self.eos), first or 0.0)
        return run.figures(time.perf_counter() - start)

    def _eval_scores(self, ids: list[int], start: int) -> list[float]:
        """Logprobs of ids[start:], reusing the longest prefix already in the context."""
        import numpy as np

        llm = self.scorer
        keep = min(common_prefix_len(list(llm.input_ids[: llm.n_tokens]), ids), start - 1)
        llm.n_tokens = keep  # eval() drops the KV past n_tokens before it extends
        llm.eval(ids[keep:])
        rows = np.asarray(llm.scores[start - 1 : len(ids) - 1], dtype=np.float64)  # (n, V)
        rows = rows - rows.max(axis=1, keepdims=True)
        logp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
        return [float(logp[j, t]) for j, t in enumerate(ids[start:])]

    def w2(self, wl: Workloads) -> dict[str, Any]:
        self.scorer.reset()
        _, items = select_items(self.tokenizer, wl)
        start = time.perf_counter()
        scores = [[self._eval_scores(c.ids, c.start) for c in it.choices] for it in items]
        wall = time.perf_counter() - start
        decisions = [decide(s)[0] for s in scores]
        return {
            "wall_s": wall,
            "decisions": decisions,
            "accuracy": sum(d == it.answer for d, it in zip(decisions, items)) / len(items),
        }

    def w3(self, wl: Workloads) -> dict[str, Any]:
        self._fresh()
        grammar = self.grammar_cls.from_json_schema(json.dumps(wl.json_schema), verbose=False)
        prompts = [json_prompt_ids(self.tokenizer, wl, p) for p in wl.products]
        start = time.perf_counter()
        texts = [
            self.llm.create_completion(
                ids, max_tokens=wl.json_max_new_tokens, temperature=0, grammar=grammar
            )["choices"][0]["text"]
            for ids in prompts
        ]
        return json_figures(time.perf_counter() - start, texts, wl.json_schema)

    def w4(self, wl: Workloads) -> dict[str, Any]:
        self._fresh()
        ids = raw_ids(self.tokenizer, wl.decode_prompt)
        no_eos = {t: -1e9 for t in self.eos}
        start = time.perf_counter()
        out = self.llm.create_completion(
            ids, max_tokens=wl.decode_new_tokens_b1, temperature=0, logit_bias=no_eos
        )
        wall = time.perf_counter() - start
        # NOTE: llama-cpp-python generates one sequence per call: no batch-16 figure.
        return {
            "batch1_tokens_per_s": out["usage"]["completion_tokens"] / wall,
            "batch1_wall_s": wall,
        }


class Outlines:
    """outlines' JSON-schema generation over the same transformers model (W3 only)."""

    name = "outlines"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.outlines = _require("outlines")
        self.tokenizer = tokenizer
        self.model = model

    def warmup(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def _generator(self, schema: str) -> Any:
        ol = self.outlines
        if hasattr(ol, "from_transformers"):  # outlines >= 1.0
            from outlines.types import JsonSchema

            generator = ol.Generator(
                ol.from_transformers(self.model, self.tokenizer), JsonSchema(schema)
            )
            return lambda prompt, n: generator(prompt, max_new_tokens=n)
        model = ol.models.Transformers(self.model, self.tokenizer)  # outlines 0.x
        generator = ol.generate.json(model, schema)
        return lambda prompt, n: generator(prompt, max_tokens=n)

    def w3(self, wl: Workloads) -> dict[str, Any]:
        generate = self._generator(json.dumps(wl.json_schema))
        prompts = [
            self.tokenizer.decode(json_prompt_ids(self.tokenizer, wl, p)) for p in wl.products
        ]
        generate(prompts[0], 1)  # compiles what outlines compiles lazily, outside the timing
        start = time.perf_counter()
        texts = []
        for prompt in prompts:
            out = generate(prompt, wl.json_max_new_tokens)
            texts.append(out if isinstance(out, str) else json.dumps(out))
        return json_figures(time.perf_counter() - start, texts, wl.json_schema)

"""sgl_lite through its Engine API: W1–W4 as a user of `Engine.generate` would write them.

Each method runs one repetition from a flushed cache and returns a dict of figures plus the
outputs the runner checks. Requests that belong together are submitted together (one list, or
concurrent calls), since that is how the engine is meant to be used.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

from bench.common import (
    ChatRun,
    Skipped,
    decide,
    eos_ids,
    json_prompt_ids,
    raw_ids,
    select_items,
    strip_eos,
    validate_json,
)
from bench.workloads import Workloads

# Big enough for W1 (8 conversations of <1k tokens) and W2 (24 questions x 4 choices).
MAX_TOTAL_TOKENS = 16384


class SglLite:
    """The engine under test; a second engine with jump-forward off is built on first use."""

    name = "sgl_lite"

    def __init__(self, num_threads: int, engine: Any = None) -> None:
        from sgl_lite.backend.engine import Engine

        self.num_threads = num_threads
        self.engine = engine or Engine(num_threads=num_threads, max_total_tokens=MAX_TOTAL_TOKENS)
        self.tokenizer = self.engine.tokenizer
        self.eos = eos_ids(self.tokenizer, self.engine.runner.hf_config)
        self._no_jf: Any = None

    @property
    def no_jump_forward(self) -> Any:
        if self._no_jf is None:
            from sgl_lite.backend.engine import Engine

            self._no_jf = Engine(
                num_threads=self.num_threads,
                max_total_tokens=4096,
                disable_jump_forward=True,
            )
        return self._no_jf

    def shutdown(self) -> None:
        for eng in (self.engine, self._no_jf):
            if eng is not None:
                eng.shutdown()

    def _fresh(self, engine: Any = None) -> dict[str, Any]:
        engine = engine or self.engine
        if not engine.flush_cache():
            raise RuntimeError("could not flush the cache: the engine still has requests")
        return engine.get_server_info()

    def warmup(self) -> None:
        self.engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})

    # --- W1 -------------------------------------------------------------------------------------
    def w1(self, wl: Workloads) -> dict[str, Any]:
        before = self._fresh()
        run = ChatRun(self.tokenizer, wl)
        params = {"temperature": 0, "max_new_tokens": wl.chat_max_new_tokens}
        start = time.perf_counter()
        for _ in range(run.num_turns):
            prompts = [run.prompt(c) for c in range(len(wl.conversations))]
            sent = time.perf_counter()
            first: dict[int, float] = {}
            last: dict[int, dict] = {}
            for chunk in self.engine.generate(
                input_ids=prompts, sampling_params=params, stream=True
            ):
                i = chunk["index"]
                first.setdefault(i, time.perf_counter() - sent)
                last[i] = chunk
            for c in range(len(prompts)):
                run.record(c, strip_eos(last[c]["output_ids"], self.eos), first[c])
        wall = time.perf_counter() - start
        after = self.engine.get_server_info()
        submitted = after["prompt_tokens_submitted"] - before["prompt_tokens_submitted"]
        hit = after["cache_hit_tokens"] - before["cache_hit_tokens"]
        return {
            **run.figures(wall, computed=submitted - hit, submitted=submitted),
            "forward_passes": after["forward_passes"] - before["forward_passes"],
            "max_running_batch_seen": after["max_running_batch_seen"],
        }

    # --- W2 -------------------------------------------------------------------------------------
    def _score(self, item) -> list[list[float]]:
        start = min(c.start for c in item.choices)
        self.engine.generate(
            input_ids=item.prompt_ids[:start], sampling_params={"max_new_tokens": 0}
        )
        # NOTE: as SGLang, the first input logprob is always null: ask from one token earlier
        from_pos = max(start - 1, 0)
        outs = self.engine.generate(
            input_ids=[c.ids for c in item.choices],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=from_pos,
        )
        scores = []
        for choice, out in zip(item.choices, outs):
            entries = out["meta_info"]["input_token_logprobs"][choice.start - from_pos :]
            if len(entries) != len(choice.ids) - choice.start:
                raise RuntimeError(
                    f"engine returned {len(entries)} logprobs for a "
                    f"{len(choice.ids) - choice.start}-token choice"
                )
            scores.append([float(e[0]) for e in entries])
        return scores

    def w2(self, wl: Workloads) -> dict[str, Any]:
        before = self._fresh()
        shared, items = select_items(self.tokenizer, wl)
        start = time.perf_counter()
        # The shared prefix once, then every question's prompt and choices concurrently.
        self.engine.generate(
            input_ids=items[0].prompt_ids[:shared], sampling_params={"max_new_tokens": 0}
        )
        with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
            scores = list(pool.map(self._score, items))
        wall = time.perf_counter() - start
        after = self.engine.get_server_info()
        decisions = [decide(s)[0] for s in scores]
        submitted = after["prompt_tokens_submitted"] - before["prompt_tokens_submitted"]
        hit = after["cache_hit_tokens"] - before["cache_hit_tokens"]
        return {
            "wall_s": wall,
            "decisions": decisions,
            "accuracy": sum(d == it.answer for d, it in zip(decisions, items)) / len(items),
            "prompt_tokens_submitted": submitted,
            "prompt_tokens_computed": submitted - hit,
            "scores": [decide(s)[1] for s in scores],
        }

    # --- W3 -------------------------------------------------------------------------------------
    def _json_run(self, engine: Any, wl: Workloads, params: list[dict]) -> dict[str, Any]:
        before = self._fresh(engine)
        prompts = [json_prompt_ids(self.tokenizer, wl, p) for p in wl.products]
        wall_s, outs = _timed_generate(engine, prompts, params)
        after = engine.get_server_info()
        for out in outs:
            reason = out["meta_info"]["finish_reason"] or {}
            if reason.get("type") == "abort":
                raise Skipped(f"request aborted: {reason.get('message')}")
        texts = [o["text"] for o in outs]
        return {
            "wall_s": wall_s,
            "texts": texts,
            "valid": sum(validate_json(t, wl.json_schema) for t in texts),
            "tokens": [o["meta_info"]["completion_tokens"] for o in outs],
            "forced_tokens": sum(o["meta_info"].get("forced_tokens", 0) for o in outs),
            # an invalid output the engine itself flagged (constraint_violation), not passed off
            "reported": sum(o["meta_info"].get("constraint_violation") is not None for o in outs),
            "forward_passes": after["forward_passes"] - before["forward_passes"],
        }

    def w3(self, wl: Workloads) -> dict[str, Any]:
        """Constrained with jump-forward (the figure), without it, and the same token counts
        unconstrained (EOS ignored) for the per-token cost of the constraint."""
        schema = json.dumps(wl.json_schema)
        params = {"temperature": 0, "max_new_tokens": wl.json_max_new_tokens, "json_schema": schema}
        n = len(wl.products)
        _warm_constrained(self.engine, params)
        _warm_constrained(self.no_jump_forward, params)
        jf = self._json_run(self.engine, wl, [params] * n)
        no_jf = self._json_run(self.no_jump_forward, wl, [params] * n)
        free = [
            {"temperature": 0, "max_new_tokens": max(t, 1), "ignore_eos": True}
            for t in no_jf["tokens"]
        ]
        unconstrained = self._json_run(self.no_jump_forward, wl, free)
        per_tok_c = no_jf["wall_s"] / max(sum(no_jf["tokens"]), 1)
        per_tok_u = unconstrained["wall_s"] / max(sum(unconstrained["tokens"]), 1)
        saved = 1 - jf["forward_passes"] / max(no_jf["forward_passes"], 1)
        return {
            "wall_s": jf["wall_s"],
            "valid": jf["valid"],
            "items": n,
            "valid_fraction": jf["valid"] / n,
            "invalid_reported": jf["reported"],
            "tokens_emitted": sum(jf["tokens"]),
            "forced_tokens": jf["forced_tokens"],
            "texts": jf["texts"],
            "forward_passes_jump_forward": jf["forward_passes"],
            "forward_passes_no_jump_forward": no_jf["forward_passes"],
            "jump_forward_passes_saved": saved,
            "wall_s_no_jump_forward": no_jf["wall_s"],
            "valid_no_jump_forward": no_jf["valid"],
            "constrained_per_token_s": per_tok_c,
            "unconstrained_per_token_s": per_tok_u,
            "constrained_over_unconstrained_per_token": per_tok_c / per_tok_u,
        }

    # --- W4 -------------------------------------------------------------------------------------
    def w4(self, wl: Workloads) -> dict[str, Any]:
        self._fresh()
        one = raw_ids(self.tokenizer, wl.decode_prompt)
        p1 = {"temperature": 0, "max_new_tokens": wl.decode_new_tokens_b1, "ignore_eos": True}
        wall1, out = _timed_generate(self.engine, one, p1)
        self._fresh()
        many = [raw_ids(self.tokenizer, p) for p in wl.decode_prompts]
        pn = {**p1, "max_new_tokens": wl.decode_new_tokens_batch}
        walln, outs = _timed_generate(self.engine, many, pn)
        tokens_n = sum(o["meta_info"]["completion_tokens"] for o in outs)
        # Prefill alone: the 16 prompts as one, from an empty cache, one new token.
        self._fresh()
        joined = [t for ids in many for t in ids]
        wallp, _ = _timed_generate(self.engine, joined, {"temperature": 0, "max_new_tokens": 1})
        return {
            "prefill_tokens": len(joined),
            "prefill_tokens_per_s": len(joined) / wallp,
            "batch1_tokens_per_s": out["meta_info"]["completion_tokens"] / wall1,
            "batch_tokens_per_s": tokens_n / walln,
            "batch_size": len(many),
            "batch1_wall_s": wall1,
            "batch_wall_s": walln,
            "weights": self.engine.runner.format.describe(),
        }


# Engine keywords of each explicit mode W4 reports besides the engine's default (the
# `sgl_lite` row: the fast mode on the file's own codes, what a user gets without flags).
MODES = {
    "deterministic": {"enable_deterministic_inference": True},
    "float32": {"dtype": "float32", "quantization": "none"},
    "bfloat16": {"dtype": "bfloat16", "quantization": "none"},
}


class SglLiteMode:
    """The engine in one explicit weight mode, for W4 only; its engine lives for one call."""

    def __init__(self, num_threads: int, mode: str) -> None:
        self.num_threads, self.mode = num_threads, mode
        self.name = f"sgl_lite_{mode}"

    def w4(self, wl: Workloads) -> dict[str, Any]:
        from sgl_lite.backend.engine import Engine

        try:
            engine = Engine(
                num_threads=self.num_threads,
                max_total_tokens=4096,
                log_level="warning",
                **MODES[self.mode],
            )
        except ValueError as exc:  # a mode this machine cannot run
            raise Skipped(f"{self.mode}: {exc}") from exc
        try:
            system = SglLite(self.num_threads, engine)
            system.warmup()
            return system.w4(wl)
        finally:
            engine.shutdown()


def _timed_generate(engine: Any, ids: Any, params: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = engine.generate(input_ids=ids, sampling_params=params)
    return time.perf_counter() - start, out


def _warm_constrained(engine: Any, params: dict) -> None:
    """Compiles the schema once (the engine caches it), outside the timed runs. NOTE: with the
    request's own max_new_tokens: a budget below the shortest valid output is refused."""
    try:
        out = engine.generate(input_ids=[1, 2, 3], sampling_params=params)
    except Exception as exc:
        raise Skipped(f"json_schema decoding failed: {type(exc).__name__}: {exc}") from exc
    reason = out["meta_info"]["finish_reason"] or {}
    if reason.get("type") == "abort":
        raise Skipped(f"json_schema decoding failed: {reason.get('message')}")

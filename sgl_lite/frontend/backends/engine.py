"""EngineBackend: the in-process backend over `sgl_lite.backend.engine.Engine`.

Generation sends the whole program text; the engine's radix cache makes the shared prefix
free. Select prefills the prefix once, then scores every choice in one engine call as an
extension of it, reading `input_token_logprobs` for exactly the choice's tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from sgl_lite.frontend.backends.base import Backend, GenRequest, GenResult, Prompt, timeout_of
from sgl_lite.frontend.chat_template import ChatTemplate, from_tokenizer, get_chat_template
from sgl_lite.frontend.choices import (
    ChoicesDecision,
    ChoicesMethod,
    choice_tokens,
    logprob_values,
)


class EngineBackend(Backend):
    """Runs programs on an in-process Engine (`engine=` an existing one, or built from kwargs)."""

    def __init__(
        self,
        model_path: str | None = None,
        *,
        engine: Any = None,
        chat_template: ChatTemplate | str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        if engine is None:
            # NOTE: imported here, not at the top: the engine loads torch, and `import sgl_lite`
            # must not.
            from sgl_lite.backend.engine import Engine

            threads = os.environ.get("SGL_LITE_NUM_THREADS")
            if threads and "num_threads" not in engine_kwargs:
                engine_kwargs["num_threads"] = int(threads)
            engine = Engine(model_path=model_path, **engine_kwargs)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        if isinstance(chat_template, str):
            chat_template = get_chat_template(chat_template)
        self.chat_template = chat_template or from_tokenizer(self.tokenizer)

    # --- generation ---------------------------------------------------------------------------
    def _generate(self, prompt: Prompt, request: GenRequest, *, stream: bool) -> Any:
        """`Engine.generate` for the whole program text so far (a dict, or with `stream` an
        iterator of them)."""
        return self.engine.generate(
            prompt=prompt.text,
            sampling_params=dict(request.sampling_params),
            return_logprob=request.return_logprob,
            logprob_start_len=request.logprob_start_len,
            top_logprobs_num=request.top_logprobs_num,
            return_text_in_logprobs=request.return_text_in_logprobs,
            stream=stream,
            timeout=request.timeout,  # the engine aborts the request then, slots freed
        )

    def generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        out = self._generate(prompt, request, stream=False)
        _raise_on_abort(out, request)
        return GenResult(out["text"], out["meta_info"])

    def generate_stream(self, prompt: Prompt, request: GenRequest) -> Iterator[GenResult]:
        last = None
        for chunk in self._generate(prompt, request, stream=True):
            last = chunk
            yield GenResult(chunk["text"], chunk.get("meta_info", {}))
        if last is not None:
            _raise_on_abort(last, request)

    def cache_prefix(self, text: str) -> None:
        self.engine.generate(prompt=text, sampling_params={"max_new_tokens": 0})

    # --- select -------------------------------------------------------------------------------
    def select(
        self, prompt: Prompt, choices: Sequence[str], method: ChoicesMethod
    ) -> ChoicesDecision:
        prefix_ids = self.tokenizer.encode(prompt.text, add_special_tokens=False)
        toks = [choice_tokens(self.tokenizer, prompt.text, c, prefix_ids) for c in choices]
        # SGLang's alignment: the entry at logprob_start_len has no logprob, so the span starts
        # one token before the earliest choice token (which then gets its value)
        start = max(min(t.start for t in toks) - 1, 0)
        if prefix_ids:
            # NOTE: prefill once so the scoring batch below finds the prefix in the cache.
            self.engine.generate(input_ids=prefix_ids, sampling_params={"max_new_tokens": 0})
        outs = self.engine.generate(
            input_ids=[t.ids for t in toks],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=start,
        )
        scored, choice_entries = [], []
        for t, out in zip(toks, outs):
            entries = out["meta_info"]["input_token_logprobs"]
            entries = _align(entries, t.ids, start)[t.start - start :]
            choice_entries.append([list(e) for e in entries])
            scored.append(logprob_values(entries))
        uncond = None
        if method.requires_unconditional_logprobs:
            uncond = self._unconditional([t.ids[t.start :] for t in toks])
        decision = method(
            choices=choices, token_logprobs=scored, unconditional_token_logprobs=uncond
        )
        meta = dict(decision.meta_info or {})  # a method may leave it None (SGLang's default)
        meta.update(
            {
                "prompt_tokens": len(prefix_ids),
                "choice_tokens": [len(t.ids) - t.start for t in toks],
                "boundary_merged": [t.merged for t in toks],
                "cached_tokens": [o["meta_info"].get("cached_tokens") for o in outs],
                # SGLang's key, with the token ids the engine scored
                "input_token_logprobs": choice_entries,
            }
        )
        return ChoicesDecision(decision.decision, meta)

    def _unconditional(self, choice_ids: list[list[int]]) -> list[list[float]]:
        """The choices' logprobs without the prompt (after BOS when the model has one)."""
        bos = self.tokenizer.bos_token_id
        head = [bos] if bos is not None else []
        outs = self.engine.generate(
            input_ids=[head + ids for ids in choice_ids],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        return [logprob_values(o["meta_info"]["input_token_logprobs"][len(head) :]) for o in outs]

    # --- admin --------------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        self.engine.shutdown()


def _align(entries: list, ids: list[int], start: int) -> list:
    """Checks that logprob entries cover `ids[start:]` (one per token) and returns them."""
    want = ids[start:]
    if len(entries) != len(want) or any(
        e[1] is not None and e[1] != tid for e, tid in zip(entries, want)
    ):
        raise RuntimeError(
            f"engine returned {len(entries)} input logprobs from position {start} for a "
            f"{len(ids)}-token prompt; expected one per token {want[:8]}..."
        )
    return entries


def _raise_on_abort(out: dict, request: GenRequest | None = None) -> None:
    if request is not None and (timed_out := timeout_of(out.get("meta_info") or {}, request)):
        raise timed_out
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise RuntimeError(f"the engine aborted the request: {reason.get('message')}")

"""OutputProcessor: applies a step's results to requests and turns requests into SGLang results.

It records logprobs, appends sampled tokens, advances grammar guides (with jump-forward over forced
text), detects every finish condition (EOS, stop token, stop string, length, grammar done) and
builds SGLang's native result dicts. It knows tokens and text, never tensors of K/V.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from sgl_lite.backend.cache_manager import CacheManager
from sgl_lite.backend.request import Req


class OutputProcessor:
    """Per-token bookkeeping after each forward pass."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: set[int],
        cache: CacheManager,
        jump_forward: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.cache = cache
        self.jump_forward = jump_forward

    # --- logprobs -----------------------------------------------------------------------
    def record_input_logprobs(
        self, req: Req, start: int, logits: torch.Tensor | None, top_k: int
    ) -> None:
        """Input-token logprobs from the logits rows of positions start.. (row p predicts p+1)."""
        if not req.needs_input_logprobs:
            return
        ids, first = req.input_ids, req.logprob_start_len
        if first == 0 and not req.input_token_logprobs:
            req.input_token_logprobs.append([None, ids[0], self._token_text(req, ids[0])])
            req.input_top_logprobs.append(None)
        if logits is not None:
            positions = range(start, start + logits.shape[0])
            wanted = [i for i, p in enumerate(positions) if max(first, 1) <= p + 1 < len(ids)]
            if wanted:
                logprobs = torch.log_softmax(logits[wanted].float(), dim=-1)
                targets = torch.tensor([ids[positions[i] + 1] for i in wanted])
                chosen = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
                tops = logprobs.topk(top_k, dim=-1) if top_k > 0 else None
                for j, i in enumerate(wanted):
                    token = ids[positions[i] + 1]
                    req.input_token_logprobs.append(
                        [chosen[j], token, self._token_text(req, token)]
                    )
                    req.input_top_logprobs.append(
                        self._top_entries(req, tops.values[j].tolist(), tops.indices[j].tolist())
                        if tops is not None
                        else None
                    )
        if start + (0 if logits is None else logits.shape[0]) >= len(ids) - 1 or first >= len(ids):
            req.input_logprobs_done = True

    def _token_text(self, req: Req, token: int) -> str | None:
        return self.tokenizer.decode([token]) if req.return_text_in_logprobs else None

    def _top_entries(self, req: Req, values: list[float], ids: list[int]) -> list[list[Any]]:
        return [[v, t, self._token_text(req, t)] for v, t in zip(values, ids)]

    # --- a sampled token ----------------------------------------------------------------
    def append_token(
        self, req: Req, token: int, logprob: float | None, top: list[tuple[float, int]] | None
    ) -> None:
        """Adds one sampled token to `req` and sets `finish_reason` if it ended the request."""
        params = req.sampling_params
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        req.output_ids.append(token)
        if req.return_logprob:
            req.output_token_logprobs.append([logprob, token, self._token_text(req, token)])
            if req.top_logprobs_num > 0 and top is not None:
                pairs = top[: req.top_logprobs_num]
                req.output_top_logprobs.append(
                    self._top_entries(req, [v for v, _ in pairs], [t for _, t in pairs])
                )
        if token in self.eos_token_ids and not params.ignore_eos or token in params.stop_token_ids:
            self._set_finished(req, {"type": "stop", "matched": token})
        elif req.guide is not None:
            req.guide.advance(token)
            if req.guide.is_finished():
                self._set_finished(req, {"type": "stop", "matched": None})
            elif self.jump_forward:
                self._jump_forward(req)
        self._check_length_and_stop_strings(req)

    def _jump_forward(self, req: Req) -> None:
        """Appends the text the grammar forces, retokenized, without sampling it."""
        from sgl_lite.backend.constrained import apply_jump_forward, plan_jump_forward

        plan = plan_jump_forward(self.tokenizer, req.guide, req.output_ids)
        if plan is None:
            return
        kept_kv = len(req.input_ids) + plan.keep
        if kept_kv < req.kv_len and not self.cache.truncate(req, kept_kv):
            return
        before = len(req.output_ids)
        if not apply_jump_forward(req.guide, plan):
            return
        req.output_ids[plan.keep :] = plan.new_ids
        req.forced_tokens += len(req.output_ids) - before
        if req.guide.is_finished():
            self._set_finished(req, {"type": "stop", "matched": None})

    def _check_length_and_stop_strings(self, req: Req) -> None:
        params = req.sampling_params
        if req.finish_reason is None and len(req.output_ids) >= params.max_new_tokens:
            del req.output_ids[params.max_new_tokens :]
            self._set_finished(req, {"type": "length", "length": params.max_new_tokens})
        req.text = self.decode(req)
        if params.stop and (req.finish_reason is None or req.finish_reason["type"] == "length"):
            hits = [(req.text.find(s), s) for s in params.stop if s in req.text]
            if hits:
                cut, matched = min(hits)
                req.text = req.text if params.no_stop_trim else req.text[:cut]
                self._set_finished(req, {"type": "stop", "matched": matched}, force=True)

    def decode(self, req: Req) -> str:
        """The output text, without a trailing partial UTF-8 character."""
        text = self.tokenizer.decode(
            req.output_ids, skip_special_tokens=req.sampling_params.skip_special_tokens
        )
        return text[:-1] if text.endswith("\ufffd") and not req.finish_reason else text

    @staticmethod
    def _set_finished(req: Req, reason: dict[str, Any], force: bool = False) -> None:
        if req.finish_reason is None or force:
            req.finish_reason = reason

    # --- results ------------------------------------------------------------------------
    def result(self, req: Req) -> dict[str, Any]:
        """SGLang's native result dict for `req` as it stands."""
        end = req.finished_at or time.perf_counter()
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason,
            "e2e_latency": end - req.created_at,
            "forced_tokens": req.forced_tokens,
        }
        if req.guide is not None and req.finished_at and req.finish_reason["type"] != "abort":
            meta.update(req.guide.meta_info(req.text))  # budget_closed, constraint_violation
        if req.return_logprob:
            # Copies: the loop thread keeps appending to the request's own lists.
            meta["input_token_logprobs"] = list(req.input_token_logprobs)
            meta["output_token_logprobs"] = list(req.output_token_logprobs)
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = list(req.input_top_logprobs)
                meta["output_top_logprobs"] = list(req.output_top_logprobs)
        return {"text": req.text, "output_ids": list(req.output_ids), "meta_info": meta}

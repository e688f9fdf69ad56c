"""OutputProcessor: what one sample does to its request (tokens, grammar, text, finish).

It records logprobs, appends the sampled token, advances the grammar guide (with
jump-forward over forced text), feeds the detokenizer and detects every finish condition (EOS,
stop token, grammar done, length, stop string, stop regex). It touches no KV memory: when
jump-forward replaced tokens whose K/V exists, it says where the K/V must be cut, and the
scheduler (the one owner of slots) cuts it.
"""

from __future__ import annotations

import time
from typing import Any

from sgl_lite.backend.constrained.jump_forward import apply_jump_forward, plan_jump_forward
from sgl_lite.backend.scheduler.detokenizer import IncrementalDetokenizer
from sgl_lite.backend.scheduler.logprobs import TokenLogprobs
from sgl_lite.backend.types import FinishReason, Req, ReqOutput, Sample
from sgl_lite.common.tokenizer import Tokenizer


class OutputProcessor:
    """Per-request bookkeeping after each forward pass."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: set[int], jump_forward: bool) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.jump_forward = jump_forward

    def apply(self, req: Req, sample: Sample, completes: bool) -> int | None:
        """Applies `sample` to `req` (setting `finish_reason` when it ended); returns the K/V
        length to cut the request back to, or None."""
        if sample.input_logprobs is not None and req.logprobs is not None:
            req.logprobs.add_input(req.input_ids, sample.input_logprobs, self.token_text)
        if not completes:
            return None
        if sample.token is None:  # max_new_tokens == 0: a prefill only
            req.finish_reason = FinishReason.length_reached(0)
            self.detokenizer(req).finish(req.output_ids, None)
            return None
        return self._append(req, sample.token, sample)

    def progress(self, req: Req) -> ReqOutput:
        """The request's output since its last one (text, ids, counts; the constraint check on
        its final one); stamps `finished_at` on a finished request."""
        now = time.perf_counter()
        if req.finish_reason is not None:
            req.finished_at = req.finished_at or now
        detok = self.detokenizer(req)
        start = req.ids_sent
        req.ids_sent = len(req.output_ids)
        return ReqOutput(
            rid=req.rid,
            text=detok.take(),
            output_ids=tuple(req.output_ids[start:]),
            ids_start=start,
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            forced_tokens=req.forced_tokens,
            e2e_latency=(req.finished_at or now) - req.created_at,
            finish_reason=req.finish_reason,
            logprobs=None if req.logprobs is None else req.logprobs.take(),
            constraint=_constraint_meta(req, detok),
        )

    def detokenizer(self, req: Req) -> IncrementalDetokenizer:
        """The request's detokenizer (made on first use)."""
        if req.detokenizer is None:
            req.detokenizer = IncrementalDetokenizer(self.tokenizer, req.sampling_params)
        return req.detokenizer

    def token_text(self, token: int) -> str:
        """One token's text, for logprob entries."""
        return self.tokenizer.decode([token])

    def _append(self, req: Req, token: int, sample: Sample) -> int | None:
        params = req.sampling_params
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        eos = token in self.eos_token_ids and not params.ignore_eos
        stops = eos or token in params.stop_token_ids
        sampled = token
        if not stops and req.guide is not None:
            # a grammar backend keeps the output closable within max_new_tokens by replacing a
            # token its closer would not fit after (constrained/matchers/closer.py; the
            # automaton's mask already did); eos = it is complete
            token = req.guide.budget_substitute(token)
            stops = token == req.guide.eos_token_id
        req.output_ids.append(token)
        if req.logprobs is not None and sample.logprobs is not None:
            self._add_logprob(req, token, sampled, sample)
        cut: int | None = None
        reason: FinishReason | None = None
        if stops:
            reason = FinishReason.stop(token)
        elif req.guide is not None:
            req.guide.advance(token)
            if not req.guide.is_finished() and self.jump_forward:
                cut = self._jump_forward(req)
            if req.guide.is_finished():
                reason = FinishReason.stop(None)
        if reason is None and len(req.output_ids) >= params.max_new_tokens:
            del req.output_ids[params.max_new_tokens :]  # jump-forward may overshoot
            reason = FinishReason.length_reached(params.max_new_tokens)
        detok = self.detokenizer(req)
        match = detok.feed(req.output_ids)
        # NOTE: a stop string or regex ends the text even on the length-limit token, but not
        # after EOS or a finished grammar (SGLang's order).
        if match is not None and (reason is None or reason.type == "length"):
            reason = FinishReason.stop(match.stop)
        else:
            match = None  # an EOS or a finished grammar ends the text untrimmed
        if reason is not None:
            req.finish_reason = reason
            detok.finish(req.output_ids, match)
        return cut

    def _add_logprob(self, req: Req, token: int, sampled: int, sample: Sample) -> None:
        """Records the emitted token's logprob. NOTE: a token the budget substituted was not
        sampled, and the sampler kept only the sampled token's logprob and the top-k: its own
        value is taken from the top-k when listed, else the sampled token's value stands in
        (an upper bound under greedy decoding); `budget_closed` marks such outputs."""
        assert req.logprobs is not None and sample.logprobs is not None
        values = sample.logprobs
        if token != sampled:
            tops = values.top[sample.row] if values.top is not None else []
            own = next((lp for lp, t in tops if t == token), values.chosen[sample.row])
            # the chosen ids' values are the position's, whichever token fills it
            ids = None if values.ids is None else [values.ids[sample.row]]
            values = TokenLogprobs([own], [tops] if values.top is not None else None, ids)
            row = 0
        else:
            row = sample.row
        req.logprobs.add_output(token, values, row, self.token_text)

    def _jump_forward(self, req: Req) -> int | None:
        """Appends the text the grammar forces, retokenized, without sampling it; returns the
        K/V length to cut back to when it replaced tokens that have K/V."""
        guide = req.guide
        assert guide is not None
        plan = plan_jump_forward(self.tokenizer, guide, req.output_ids)
        if plan is None:
            return None
        kept_kv = len(req.input_ids) + plan.keep
        if kept_kv < req.prefix_len:  # those slots are the tree's and must stay
            return None
        if not apply_jump_forward(guide, plan):
            return None
        before = len(req.output_ids)
        self.detokenizer(req).rewind(plan.keep)
        req.output_ids[plan.keep :] = plan.new_ids
        req.ids_sent = min(req.ids_sent, plan.keep)
        req.forced_tokens += len(req.output_ids) - before
        return kept_kv if kept_kv < req.kv_len else None


def _constraint_meta(req: Req, detok: IncrementalDetokenizer) -> dict[str, Any] | None:
    """A finished constrained output checked against its constraint, once, at the end, with
    `constraint_notes`: what serving it left unenforced (an unknown format...), often none."""
    reason = req.finish_reason
    if req.guide is None or reason is None or reason.type == "abort":
        return None
    return {**req.guide.meta_info(detok.text), "constraint_notes": list(req.constraint_notes)}

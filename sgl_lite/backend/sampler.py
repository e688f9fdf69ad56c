"""Sampler: turns a batch's last-position logits into next tokens.

Order per row (as SGLang and vLLM do it): penalties, then constraint masks (grammar, min tokens),
then temperature, top-k, top-p, min-p, then greedy argmax or a draw from the request's own
generator. Output logprobs are taken from the raw logits, before any of that.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sgl_lite.backend.request import Req


class SampleResult(NamedTuple):
    """Next token per request, with its logprob and optional top alternatives."""

    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[float, int]]] | None


class Sampler:
    """Batched sampling with per-request parameters."""

    def __init__(self, eos_token_ids: set[int], vocab_size: int) -> None:
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> SampleResult:
        """logits: (B, V) float32 for the B requests, in order → one token each."""
        want_logprobs = any(r.return_logprob for r in reqs)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        logits = self._apply_penalties_and_masks(logits, reqs)
        tokens = logits.argmax(dim=-1)
        for i, req in enumerate(reqs):
            if not req.sampling_params.is_greedy:
                tokens[i] = self._draw(logits[i], req)
        token_list = tokens.tolist()
        if raw_logprobs is None:
            return SampleResult(token_list, None, None)
        chosen = raw_logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        k = max(r.top_logprobs_num for r in reqs)
        top = None
        if k > 0:
            values, ids = raw_logprobs.topk(k, dim=-1)
            top = [list(zip(v, t)) for v, t in zip(values.tolist(), ids.tolist())]
        return SampleResult(token_list, chosen, top)

    def _apply_penalties_and_masks(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        needs_copy = any(
            r.sampling_params.has_penalties or r.guide is not None or self._blocks_stop(r)
            for r in reqs
        )
        if not needs_copy:
            return logits
        logits = logits.clone()
        for i, req in enumerate(reqs):
            params = req.sampling_params
            row = logits[i]
            if params.has_penalties:
                _apply_penalties(row, req)
            if req.guide is not None:
                allowed = req.guide.allowed_mask().to(row.device)
                # Ids past the tokenizer's vocabulary (padding rows of the LM head) never fit.
                row[: allowed.shape[0]].masked_fill_(~allowed, float("-inf"))
                row[allowed.shape[0] :] = float("-inf")
            if self._blocks_stop(req):
                stop_ids = [
                    t
                    for t in self.eos_token_ids | set(params.stop_token_ids)
                    if t < self.vocab_size
                ]
                row[stop_ids] = float("-inf")
        return logits

    def _blocks_stop(self, req: Req) -> bool:
        return len(req.output_ids) < req.sampling_params.min_new_tokens

    @staticmethod
    def _draw(row: torch.Tensor, req: Req) -> int:
        params = req.sampling_params
        row = row / max(params.temperature, 1e-5)
        if params.top_k > 0 and params.top_k < row.shape[-1]:
            kth = torch.topk(row, params.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest set whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(-1) - sorted_probs > params.top_p
            sorted_probs[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if params.min_p > 0:
            probs[probs < params.min_p * probs.max()] = 0
        return int(torch.multinomial(probs, 1, generator=req.generator).item())


def _apply_penalties(row: torch.Tensor, req: Req) -> None:
    """Frequency/presence penalties over the output; repetition penalty over prompt + output."""
    params = req.sampling_params
    device = row.device
    if req.output_ids and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(
            torch.tensor(req.output_ids, device=device), minlength=row.shape[-1]
        )[: row.shape[-1]].to(row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.fill_ids)), device=device)
        values = row[seen]
        row[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )

"""Sampler: turns a forward pass's logits into what each request gets from it.

It reads the runner's output (`ForwardOutput`: logits rows and which rows are whose) and
returns one `Sample` per batch entry: the next token for a request whose sequence is complete,
and the prompt logprobs the pass computed. Everything tensor-shaped ends here; what comes out
is plain numbers.

Order per row (as SGLang and vLLM do it): penalties, logit_bias, then the request's custom
logit processor (custom_logits.py), then constraint masks (grammar, min tokens; after the bias
and the processor, so a constraint always wins: SGLang runs processors after its grammar mask,
where one could bring back a token the grammar forbids), then temperature, top-k, top-p, min-p,
then greedy argmax or a draw. Output logprobs are taken from the raw logits, before any of that.
A request with a `sampling_seed` draws from its own generator, the others from the sampler's
(seeded from the engine config, never the global one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.scheduler.custom_logits import apply_processors, no_token_left
from sgl_lite.backend.scheduler.logprobs import TokenLogprobs, token_logprobs
from sgl_lite.backend.types import Req, Sample

if TYPE_CHECKING:
    from sgl_lite.backend.types import ForwardOutput, ScheduleBatch


# greedy_argmax: chunk width, and the batch size (rows x vocab) from which chunking wins
ARGMAX_CHUNK = 256
ARGMAX_FAST_MIN = 1 << 17
# top-p: the likeliest tokens looked at first (the whole row is sorted only if they fall short)
NUCLEUS_CANDIDATES = 256


class Sampler:
    """Batched sampling with per-request parameters."""

    def __init__(self, eos_token_ids: set[int], vocab_size: int, seed: int = 0) -> None:
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def sample(
        self,
        batch: ScheduleBatch,
        output: ForwardOutput,
        masks: Mapping[Req, torch.Tensor] | None = None,
    ) -> list[Sample]:
        """One Sample per request of `batch`, from the pass's `output`; `masks` are the grammar
        masks computed for this step (mask_prefetch.py), else each guide is asked here. A
        request that ended during the step gets an empty Sample; one whose logit processor
        failed gets a Sample with that `error` and no token."""
        samples = [Sample() for _ in batch.reqs]
        sampling: list[int] = []  # batch entries that sample a token
        for i, (req, segment) in enumerate(zip(batch.reqs, batch.segments)):
            if req.is_finished:
                continue
            completes = batch.completes(i)
            if completes and req.sampling_params.max_new_tokens > 0:
                sampling.append(i)
            if req.needs_input_logprobs:
                assert req.logprobs is not None
                rows = output.rows(i)
                if rows is not None and completes:
                    rows = rows[:-1]  # the last row predicts the next token, not a prompt one
                got = req.logprobs.input_logprobs(req.input_ids, segment, rows)
                samples[i] = Sample(input_logprobs=got)
        if not sampling:
            return samples
        assert output.logits is not None
        last = [output.ranges[i][1] - 1 for i in sampling]  # each request's last row
        logits = output.logits
        if len(last) != logits.shape[0]:
            logits = logits.index_select(0, torch.tensor(last, device=logits.device))
        reqs = [batch.reqs[i] for i in sampling]
        failed: dict[int, InvalidRequest] = {}
        tokens, values = self.sample_rows(logits.float().cpu(), reqs, masks, failed)
        for row, (i, token) in enumerate(zip(sampling, tokens)):
            if row in failed:
                samples[i] = samples[i]._replace(error=failed[row])
            else:
                samples[i] = samples[i]._replace(token=token, logprobs=values, row=row)
        return samples

    def sample_rows(
        self,
        logits: torch.Tensor,
        reqs: list[Req],
        masks: Mapping[Req, torch.Tensor] | None = None,
        failed: dict[int, InvalidRequest] | None = None,
    ) -> tuple[list[int], TokenLogprobs | None]:
        """logits (B, V) for the B requests, in order → one token each, and their logprobs
        when any request asked for them. A row whose custom logit processor failed is added
        to `failed` (its token is then meaningless); without `failed`, that error is raised."""
        want_logprobs = any(r.logprobs is not None for r in reqs)
        raw = logits if want_logprobs else None
        errors: dict[int, InvalidRequest] = {}
        logits = self._apply_penalties_and_masks(logits, reqs, masks, errors)
        if errors and failed is None:
            raise next(iter(errors.values()))
        if errors:
            assert failed is not None
            failed.update(errors)
            # NOTE: a failed row may hold no finite logit; give it one so the draw cannot fail
            for row in errors:
                logits[row] = 0.0
        greedy = [r.sampling_params.is_greedy for r in reqs]
        tokens = greedy_argmax(logits) if any(greedy) else torch.zeros(len(reqs), dtype=torch.long)
        drawn = [i for i, g in enumerate(greedy) if not g]
        if drawn:
            tokens[drawn] = self._draw_rows(logits, [reqs[i] for i in drawn], drawn)
        if raw is None:
            return tokens.tolist(), None
        k = max(r.logprobs.top_k for r in reqs if r.logprobs is not None)
        token_ids = [r.logprobs.token_ids if r.logprobs is not None else None for r in reqs]
        return tokens.tolist(), token_logprobs(raw, tokens, k, token_ids)

    def _apply_penalties_and_masks(
        self,
        logits: torch.Tensor,
        reqs: list[Req],
        masks: Mapping[Req, torch.Tensor] | None,
        failed: dict[int, InvalidRequest],
    ) -> torch.Tensor:
        processors = any(r.custom_logit_processor is not None for r in reqs)
        edits = processors or any(
            r.sampling_params.has_penalties or r.sampling_params.logit_bias for r in reqs
        )
        rows = [i for i, r in enumerate(reqs) if r.guide is not None]  # constrained rows
        blocks = [i for i, r in enumerate(reqs) if self._blocks_stop(r)]
        if not (edits or rows or blocks):
            return logits
        # NOTE: a copy, never in place: the runner's logits are inference tensors, and the
        # caller may still read them. When every row is masked and nothing else edits them,
        # the mask's torch.where is that copy.
        if edits or len(rows) < len(reqs):
            # contiguous: the logit_bias add indexes the flattened rows
            logits = logits.clone(memory_format=torch.contiguous_format)
            for i, req in enumerate(reqs):
                if req.sampling_params.has_penalties:
                    _apply_penalties(logits[i], req)
            _apply_logit_bias(logits, reqs)
            if processors:
                failed.update(apply_processors(logits, reqs))
        if rows:  # after the bias, so a constraint always wins
            allowed = self._allowed(logits, [reqs[i] for i in rows], masks)
            if len(rows) == logits.shape[0]:
                logits = torch.where(allowed, logits, float("-inf"))
            else:
                index = torch.tensor(rows, device=logits.device)
                picked = torch.where(allowed, logits.index_select(0, index), float("-inf"))
                logits.index_copy_(0, index, picked)
        for i in blocks:
            params = reqs[i].sampling_params
            stop_ids = [
                t
                for t in self.eos_token_ids | set(params.stop_token_ids)
                if 0 <= t < self.vocab_size
            ]
            logits[i, stop_ids] = float("-inf")
        if processors:  # a processor that banned all the constraint allows: nothing to draw
            failed.update({i: e for i, e in no_token_left(logits, reqs).items() if i not in failed})
        return logits

    @staticmethod
    def _allowed(
        logits: torch.Tensor, reqs: list[Req], masks: Mapping[Req, torch.Tensor] | None
    ) -> torch.Tensor:
        """(len(reqs), V) bool: each constrained request's grammar mask (the step's, else its
        guide's), one `torch.where` for all (a bool masked_fill_ per row is ~4x slower). Ids
        past the tokenizer's vocabulary (padding rows of the LM head) are never allowed."""
        got = []
        for req in reqs:
            mask = masks.get(req) if masks is not None else None
            if mask is None:
                assert req.guide is not None
                mask = req.guide.allowed_mask()
            got.append(mask)
        vocab = logits.shape[1]
        if all(m.shape[0] == vocab and m.device.type == "cpu" for m in got):
            # NOTE: numpy's stack, a plain copy on this thread: torch.stack of the bool rows
            # runs an OpenMP region, and on a loaded machine its tail (a team thread off the
            # cores) made it ~10 ms a step at batch 32 (p90 100 ms) for a 0.15 ms copy
            return torch.from_numpy(np.stack([m.numpy() for m in got])).to(logits.device)
        if all(m.shape[0] == vocab for m in got):
            return torch.stack(got).to(logits.device)
        out = torch.zeros(len(got), vocab, dtype=torch.bool)
        for j, mask in enumerate(got):
            out[j, : mask.shape[0]] = mask[:vocab]
        return out.to(logits.device)

    @staticmethod
    def _blocks_stop(req: Req) -> bool:
        return len(req.output_ids) < req.sampling_params.min_new_tokens

    def _draw_rows(self, logits: torch.Tensor, reqs: list[Req], rows: list[int]) -> torch.Tensor:
        """One drawn token for each of `rows` of `logits` (`reqs` in the same order).

        The rows on the sampler's generator are drawn together: one temperature divide,
        softmax and multinomial over (R, V), not four ops per row (a 16-row step drew for
        30-180 ms row by row on a loaded 2-core machine). A request with its own seed draws
        alone from its own generator, so its tokens do not depend on its batch.
        """
        tokens = torch.zeros(len(rows), dtype=torch.long)
        shared = [j for j, r in enumerate(reqs) if r.generator is None]
        for j, req in enumerate(reqs):
            if req.generator is not None:
                probs = self._probs(logits[rows[j]][None], [req])
                tokens[j] = torch.multinomial(probs, 1, generator=req.generator)[0, 0]
        if shared:
            probs = self._probs(logits[[rows[j] for j in shared]], [reqs[j] for j in shared])
            tokens[shared] = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        return tokens

    @staticmethod
    def _probs(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """(R, V) sampling distributions: temperature, then top-k, top-p and min-p per row."""
        params = [r.sampling_params for r in reqs]
        temps = torch.tensor([max(p.temperature, 1e-5) for p in params], dtype=logits.dtype)
        x = logits / temps[:, None]
        vocab = x.shape[-1]
        for j, p in enumerate(params):
            if 0 < p.top_k < vocab:
                kth = torch.topk(x[j], p.top_k).values[-1]
                x[j].masked_fill_(x[j] < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        nucleus = [j for j, p in enumerate(params) if p.top_p < 1.0]
        if nucleus:
            top_p = torch.tensor([params[j].top_p for j in nucleus], dtype=probs.dtype)
            probs[nucleus] = _nucleus(probs[nucleus], top_p)
        min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
        if bool((min_p > 0).any()):
            floor = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)  # a row with min_p 0 keeps all
        return probs


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row of `probs` (R, V) cut to its top-p nucleus: the smallest set of its likeliest
    tokens whose mass reaches top_p (the first token always stays), the rest zeroed.

    Sorting a 49k vocabulary costs ~5 ms a row; the nucleus nearly always lies within the
    NUCLEUS_CANDIDATES likeliest tokens, which `topk` finds far faster. Where their mass is
    over top_p the answer is exact from them alone (every token past them has more than top_p
    before it); only the other rows are sorted whole.
    """
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    values, order = probs.topk(k, dim=-1)  # sorted, likeliest first
    out = torch.zeros_like(probs)
    short = values.sum(-1) <= top_p  # these rows' nucleus reaches past the candidates
    if bool(short.any()):
        whole, whole_order = probs[short].sort(dim=-1, descending=True)
        out[short] = _keep_nucleus(whole, whole_order, top_p[short], probs.shape[-1])
    fits = ~short
    if bool(fits.any()):
        out[fits] = _keep_nucleus(values[fits], order[fits], top_p[fits], probs.shape[-1])
    return out


def _keep_nucleus(
    values: torch.Tensor, order: torch.Tensor, top_p: torch.Tensor, vocab: int
) -> torch.Tensor:
    """(R, vocab) probabilities: each row's likeliest `values` (R, n, descending; token ids
    `order`) up to its top-p nucleus, zero elsewhere."""
    kept = values.masked_fill(values.cumsum(-1) - values > top_p[:, None], 0.0)
    return torch.zeros(len(values), vocab, dtype=values.dtype).scatter_(1, order, kept)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` of (B, V) rows, the same indices (the first maximum; a NaN counts as
    the maximum), faster for large inputs on the CPU.

    torch's CPU argmax along a row is a scalar loop (~5 ns a logit on one core: 3.5 ms for 16
    rows of 49k), while `amax` is vectorised. So: the max of each chunk of ARGMAX_CHUNK logits,
    the first chunk holding the row's max, and argmax inside that chunk alone (~0.25 ms).
    """
    rows, vocab = logits.shape
    if logits.device.type != "cpu" or rows * vocab < ARGMAX_FAST_MIN or vocab < 2 * ARGMAX_CHUNK:
        return logits.argmax(dim=-1)
    logits = logits.contiguous()
    whole = vocab // ARGMAX_CHUNK * ARGMAX_CHUNK
    best = logits[:, :whole].view(rows, -1, ARGMAX_CHUNK).amax(-1)  # (B, chunks)
    if whole < vocab:
        best = torch.cat([best, logits[:, whole:].amax(-1, keepdim=True)], dim=1)
    start = best.argmax(-1) * ARGMAX_CHUNK  # (B,): first chunk holding the max (or a NaN)
    index = start[:, None] + torch.arange(ARGMAX_CHUNK)
    inside = logits.gather(1, index.clamp_max(vocab - 1))
    inside.masked_fill_(index >= vocab, float("-inf"))  # the last chunk may be short
    return start + inside.argmax(-1)


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


def _apply_logit_bias(logits: torch.Tensor, reqs: list[Req]) -> None:
    """Adds each request's logit_bias to its row, in place: one index_add over the flattened
    (B, V) logits for all the requests that set one."""
    vocab = logits.shape[-1]
    flat: list[int] = []
    biases: list[float] = []
    for i, req in enumerate(reqs):
        for token, bias in req.sampling_params.logit_bias:
            flat.append(i * vocab + token)
            biases.append(bias)
    if not flat:
        return
    index = torch.tensor(flat, device=logits.device)
    values = torch.tensor(biases, dtype=logits.dtype, device=logits.device)
    logits.view(-1).index_add_(0, index, values)

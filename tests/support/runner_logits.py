"""A model runner's logits outside the engine: every position's, fed in chunks of any size (a
short chunk runs the int kernels), their top-1 against a reference's, and a text's perplexity
from them."""

from __future__ import annotations

import math

import torch

from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.types import Segment


def chunked_logits(runner: ModelRunner, ids: list[int], chunk: int) -> torch.Tensor:
    """All-position logits, fed `chunk` tokens per pass (chunk <= 16 runs the int kernels)."""
    slots = runner.pool.alloc(len(ids))
    rows = []
    for start in range(0, len(ids), chunk):
        seg = Segment(
            token_ids=ids[start : start + chunk],
            start=start,
            kv_slots=slots[: start + chunk],
            logits_from=0,
        )
        rows.append(runner.forward([seg]).logits)
    runner.pool.free(slots)
    return torch.cat(rows)


def decoded_logits(runner: ModelRunner, ids: list[int], rows: int) -> torch.Tensor:
    """All-position logits (rows, T, vocab) of `rows` copies of `ids` decoded together, one
    token per row per pass (after the first token's pass), as a batched decode step runs."""
    slots = [runner.pool.alloc(len(ids)) for _ in range(rows)]
    steps = []
    for t in range(len(ids)):
        segments = [
            Segment(token_ids=[ids[t]], start=t, kv_slots=own[: t + 1], logits_from=0)
            for own in slots
        ]
        steps.append(runner.forward(segments).logits)
    for own in slots:
        runner.pool.free(own)
    return torch.stack(steps, dim=1)


# A position's top-1 is decided when the reference's leads its runner-up by this many logits;
# below it, any rounding (bf16 activations, int8-quantized inputs, the kernel a timing picked at
# load) may flip the pick. The fixed prompt of the mode tests has two such near-ties (0.012 and
# 0.061 apart, then 0.36 and up).
DECIDED_MARGIN = 0.25


def decided_disagreements(ours: torch.Tensor, reference: torch.Tensor) -> tuple[int, list[int]]:
    """How many positions of `reference` (T, vocab) are decided (DECIDED_MARGIN), and those of
    them where `ours` (T, vocab) picks another top-1."""
    top2 = reference.float().topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) >= DECIDED_MARGIN
    differs = ours.argmax(-1) != reference.argmax(-1)
    return int(decided.sum()), (decided & differs).nonzero().flatten().tolist()


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of `ids[1:]` under all-position `logits`."""
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    nll = -logprobs.gather(1, torch.tensor(ids[1:])[:, None]).mean()
    return math.exp(nll.item())

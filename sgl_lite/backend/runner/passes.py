"""How one forward pass is cut into the runs that compute it, and their logits put back
together: the fast mode's split of each prompt's last token into a pass of single tokens, and
the onnxruntime graph's groups of rows where every pass runs on it. No tensors are computed
here beyond the merge: the runs themselves belong to the runner and its steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_lite.backend.runner.decode_kv import DecodeKV
from sgl_lite.backend.types import ForwardOutput, Segment

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner.ort_step import OrtDecodeStep

Split = list[tuple[int, Segment]]  # (index of the caller's segment, the part this pass runs)
# The most new tokens of one request one graph run computes where every pass runs on the graph:
# a longer prompt chunk runs as several runs, in order. onnxruntime's arena holds the largest
# run's activations until the run ends (`ort_step.SHRINK_AFTER_TOKENS`), so a 512-token run
# raised the peak memory of a Llama-1B shape (Q4_K_M, 2 threads) by 130-210 MB, and runs of 128
# by 23-38 MB, at the same prefill speed (82-84 tok/s in one run, 82-86 in runs of 128: MLAS's
# int8 GEMM is as fast at 128 rows as at 512).
GRAPH_RUN_TOKENS = 128


def split_final_rows(segments: list[Segment]) -> tuple[Split, Split] | None:
    """The segments as two passes: every token but the last of each segment marked
    `last_alone` (a prompt's last chunk, whose last token picks the first output token), then
    those last tokens beside the single-token segments.

    Why: in the fast mode a pass's kernels depend on its size (the int kernels or the
    onnxruntime graph for a few rows, the dense GEMM for many), so the logits of a prompt's
    last token would depend on how much of the prompt was computed with it. When the radix
    cache holds the whole prompt, a repeat of the request recomputes only that token, alone.
    With the split it is always computed alone (or among decode rows), so both runs give the
    same logits and K/V; the earlier tokens' K/V come from the same pass in both (the first
    run's, which the cache kept). Output tokens are computed the same way in both runs, so
    jump-forward chunks are not split. None when no segment is marked.
    """
    if not any(s.last_alone and len(s.token_ids) > 1 for s in segments):
        return None
    head: Split = []
    tail: Split = []
    for i, seg in enumerate(segments):
        n = len(seg.token_ids)
        if seg.last_alone and n > 1:
            rest = Segment(
                token_ids=seg.token_ids[:-1],
                start=seg.start,
                kv_slots=seg.kv_slots[: seg.end - 1],
                logits_from=min(seg.logits_from, n - 1),
            )
            head.append((i, rest))
            last = Segment(
                token_ids=seg.token_ids[-1:],
                start=seg.end - 1,
                kv_slots=seg.kv_slots,
                logits_from=0,
            )
            tail.append((i, last))
        elif n == 1:
            tail.append((i, seg))
        else:
            head.append((i, seg))
    return head, tail


def merge_outputs(count: int, passes: list[tuple[Split, ForwardOutput]]) -> ForwardOutput:
    """The logits rows of `count` segments run as several passes (in order), each segment's
    rows from the earlier pass first, as one ForwardOutput."""
    parts: list[list[torch.Tensor]] = [[] for _ in range(count)]
    for split, output in passes:
        for j, (i, _) in enumerate(split):
            got = output.rows(j)
            if got is not None:
                parts[i].append(got)
    pieces: list[torch.Tensor] = []
    ranges: list[tuple[int, int]] = []
    total = 0
    for own in parts:
        n = sum(r.shape[0] for r in own)
        ranges.append((total, total + n))
        pieces.extend(own)
        total += n
    return ForwardOutput(torch.cat(pieces) if pieces else None, ranges)


def graph_passes(
    step: OrtDecodeStep,
    segments: list[Segment],
    pool: KVPool,
    lanes: list[DecodeKV],
    max_bytes: int,
) -> ForwardOutput:
    """A pass of a model with no dense linears, all on the onnxruntime graph: each request
    bringing several tokens (a prompt's chunk) runs alone, in runs of up to GRAPH_RUN_TOKENS,
    the single-token rows in groups of up to `step.max_rows`. Each run has copies of its own
    in `lanes` (lane 0: the prompt chunks; lane g + 1: group g; grown as needed), so a decode
    group's copies persist while prompts come and go; after each run the lanes are held to
    `max_bytes` (`bound_lanes`)."""
    rows = [(i, s) for i, s in enumerate(segments) if len(s.token_ids) == 1 and not s.logits_from]
    alone = [(i, s) for i, s in enumerate(segments) if len(s.token_ids) > 1 or s.logits_from]
    size = step.max_rows
    runs = [(0, [(i, piece)]) for i, s in alone for piece in pieces(s, GRAPH_RUN_TOKENS)]
    runs += [(1 + g, rows[g * size : (g + 1) * size]) for g in range(-(-len(rows) // size))]
    passes = []
    for lane, split in runs:
        while len(lanes) <= lane:
            lanes.append(DecodeKV(pool, torch.float32, max_bytes=None))
        out = step.run([s for _, s in split], pool, lanes[lane])
        if out is None:  # the lanes are unbounded and the groups sized to the step
            raise RuntimeError(f"the onnxruntime graph refused a pass of {len(split)} rows")
        passes.append((split, out))
        bound_lanes(lanes, max_bytes)
    return merge_outputs(len(segments), passes)


def pieces(segment: Segment, size: int) -> list[Segment]:
    """`segment` as consecutive segments of at most `size` new tokens, in order; each wants the
    logits `segment` wants of its own tokens (so their rows, stacked, are `segment`'s)."""
    n = len(segment.token_ids)
    if n <= size:
        return [segment]
    out = []
    for first in range(0, n, size):
        last = min(n, first + size)
        out.append(
            Segment(
                token_ids=segment.token_ids[first:last],
                start=segment.start + first,
                kv_slots=segment.kv_slots[: segment.start + last],
                logits_from=min(max(segment.logits_from - first, 0), last - first),
            )
        )
    return out


def bound_lanes(lanes: list[DecodeKV], max_bytes: int) -> None:
    """Frees the largest lanes' copies (they gather afresh when next used) while all of them
    together take more than `max_bytes`: float32 copies of every running request's whole K/V,
    padded to each group's longest, would otherwise grow past the memory the pool was sized to
    (many long requests at once)."""
    total = sum(lane.nbytes for lane in lanes)
    for lane in sorted(lanes, key=lambda lane: lane.nbytes, reverse=True):
        if total <= max_bytes:
            break
        total -= lane.nbytes
        lane.release()

"""Decode steps replayed from captured CUDA graphs; prefill and mixed passes stay eager.

A decode step of a small model on a GPU is launch-bound: ~15 kernels per layer, each a few
microseconds of work. Capturing the whole step (embedding → logits) once per batch size and
key-length bucket, and replaying it, removes the per-kernel launch cost. Shapes must be static,
so each graph reads fixed-size input buffers: a batch of b requests runs the graph of the
smallest captured size >= b, padded rows decode a dummy token into the pool's scratch slot and
attend only to it; keys past a row's length point at the scratch slot and are masked out.
Graphs are captured largest first into one memory pool, which the smaller ones reuse.

`DecodeGraphs(runner, capture=False)` runs the very same static-buffer step eagerly: that is
how the padding and masking logic is tested on machines without a GPU.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from sgl_lite.backend.runner.models.metadata import AttentionGroup, AttentionMetadata

if TYPE_CHECKING:
    from sgl_lite.backend.runner.model_runner import ModelRunner
    from sgl_lite.backend.types import ForwardOutput, Segment

logger = logging.getLogger("sgl_lite")

BATCH_SIZES = (32, 16, 8, 4, 2, 1)  # captured largest first, so smaller graphs reuse its pool
KEY_BUCKETS = (256, 1024, 4096)  # attention reads every padded key: a few lengths, not one max
DISABLE_ENV = "SGL_LITE_DISABLE_CUDA_GRAPH"


class _Buffers:
    """The static inputs and output of the graphs of one key bucket."""

    def __init__(self, batch: int, keys: int, per_kv: int, vocab: int, dev: torch.device) -> None:
        self.input_ids = torch.zeros(batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.out_slots = torch.zeros(batch, dtype=torch.long, device=dev)
        self.kv_slots = torch.zeros(batch, keys, dtype=torch.long, device=dev)
        self.mask = torch.zeros(batch, 1, per_kv, keys, dtype=torch.bool, device=dev)
        self.mask[..., 0] = True  # every row sees a key even before the first fill
        self.rows = torch.arange(batch, device=dev)
        self.logits = torch.zeros(batch, vocab, dtype=torch.float32, device=dev)


class DecodeGraphs:
    """Captured decode steps of one runner, by (batch size, key bucket)."""

    def __init__(self, runner: ModelRunner, capture: bool = True) -> None:
        self.runner = runner
        model, pool = runner.model, runner.pool
        if pool.scratch_slot is None:
            raise ValueError("DecodeGraphs needs a KVPool built with scratch_slots=1")
        config = model.config
        self.per_kv = config.num_attention_heads // config.num_key_value_heads
        self.scratch = pool.scratch_slot
        self.buckets = tuple(k for k in KEY_BUCKETS if k < runner.context_length) + (
            min(runner.context_length, KEY_BUCKETS[-1]),
        )
        self.buckets = tuple(sorted(set(self.buckets)))
        biggest = max(BATCH_SIZES)
        vocab = runner.vocab_size
        self.buffers = {
            k: _Buffers(biggest, k, self.per_kv, vocab, runner.device) for k in self.buckets
        }
        for buf in self.buffers.values():  # warm-up and capture runs write only the scratch slot
            buf.out_slots.fill_(self.scratch)
            buf.kv_slots.fill_(self.scratch)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.captured = capture
        if capture:
            started = time.perf_counter()
            self._capture_all()
            logger.info(
                "sgl_lite: captured %d CUDA graphs (batch %s x keys %s) in %.1fs",
                len(self.graphs),
                ",".join(map(str, BATCH_SIZES)),
                ",".join(map(str, self.buckets)),
                time.perf_counter() - started,
            )

    @staticmethod
    def wanted(runner: ModelRunner) -> bool:
        """CUDA graphs on a CUDA device unless SGL_LITE_DISABLE_CUDA_GRAPH=1."""
        return runner.device.type == "cuda" and os.environ.get(DISABLE_ENV, "0") != "1"

    def _step(self, batch: int, keys: int) -> None:
        """One decode step over the first `batch` rows of the `keys` bucket's buffers."""
        buf, model = self.buffers[keys], self.runner.model
        positions = buf.positions[:batch]
        cos, sin = model.rope.tables(positions, model.dtype)
        rows = buf.rows[:batch]
        kv_slots = buf.kv_slots[:batch]
        group = AttentionGroup(
            q_index=rows[:, None],
            q_flat=rows,
            rows=rows,
            kv_slots=kv_slots,
            kv_flat=kv_slots.reshape(-1),
            mask=buf.mask[:batch],  # (B, 1, G * 1, K)
            rows_in_order=True,
        )
        meta = AttentionMetadata(
            positions=positions,
            cos=cos,
            sin=sin,
            out_slots=buf.out_slots[:batch],
            groups=(group,),
            use_int=self.runner._use_int(batch),  # CPU only; CUDA runs dense weights
        )
        hidden = model(buf.input_ids[:batch], meta, self.runner.pool)
        buf.logits[:batch].copy_(model.compute_logits(hidden, meta.use_int))

    def _capture_all(self) -> None:
        # On the engine's device explicitly: the streams and the pool would otherwise sit on
        # the thread's current device, which a loop thread does not choose.
        with torch.cuda.device(self.runner.device):
            mempool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            for keys in sorted(self.buckets, reverse=True):
                for batch in BATCH_SIZES:
                    # Warm up on the capture stream first (cuBLAS handles, allocator), as
                    # PyTorch advises.
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(2):
                            self._step(batch, keys)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    # thread_local: CUDA work of another thread (a second engine) during the
                    # capture neither joins nor invalidates it.
                    with torch.cuda.graph(
                        graph, pool=mempool, stream=stream, capture_error_mode="thread_local"
                    ):
                        self._step(batch, keys)
                    self.graphs[(batch, keys)] = graph
            torch.cuda.synchronize()

    def _fits(self, segments: list[Segment]) -> tuple[int, int] | None:
        if not segments or len(segments) > max(BATCH_SIZES):
            return None
        if any(len(s.token_ids) != 1 or s.logits_from != 0 for s in segments):
            return None  # not a pure decode step
        longest = max(s.end for s in segments)
        keys = next((k for k in self.buckets if k >= longest), None)
        if keys is None:
            return None
        batch = min(b for b in BATCH_SIZES if b >= len(segments))
        return batch, keys

    def run(self, segments: list[Segment]) -> ForwardOutput | None:
        """The step's logits from a graph replay, or None when no graph fits (run eagerly)."""
        from sgl_lite.backend.types import ForwardOutput

        fit = self._fits(segments)
        if fit is None:
            return None
        batch, keys = fit
        n, pad = len(segments), batch - len(segments)
        ids = [s.token_ids[0] for s in segments] + [0] * pad
        positions = [s.start for s in segments] + [0] * pad
        out_slots = torch.cat(
            [s.kv_slots[s.start :] for s in segments] + [torch.full((pad,), self.scratch)]
        )
        kv = torch.full((batch, keys), self.scratch, dtype=torch.long)
        visible = torch.zeros(batch, keys, dtype=torch.bool)
        for i, seg in enumerate(segments):
            kv[i, : seg.end] = seg.kv_slots
            visible[i, : seg.end] = True
        visible[n:, 0] = True  # padding rows attend to the scratch slot only
        buf = self.buffers[keys]
        dev = buf.input_ids.device
        buf.input_ids[:batch].copy_(torch.tensor(ids).to(dev, non_blocking=True))
        buf.positions[:batch].copy_(torch.tensor(positions).to(dev, non_blocking=True))
        buf.out_slots[:batch].copy_(out_slots.to(dev, non_blocking=True))
        buf.kv_slots[:batch].copy_(kv.to(dev, non_blocking=True))
        mask = visible[:, None, None, :].expand(batch, 1, self.per_kv, keys)
        buf.mask[:batch].copy_(mask.to(dev, non_blocking=True))
        if self.captured:
            self.graphs[(batch, keys)].replay()
        else:
            self._step(batch, keys)
        logits = buf.logits[:n].clone()  # the next replay overwrites the buffer
        return ForwardOutput(logits, [(i, i + 1) for i in range(n)])

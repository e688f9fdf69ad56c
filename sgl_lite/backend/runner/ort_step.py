"""The fast mode's decode step on CPU as one onnxruntime graph, from embedding to logits.

A batch-1 decode step of a small model is ~850 tiny torch ops; each pays a dispatch and, with a
2-thread OpenMP team, a barrier. onnxruntime runs the same step as one graph on MLAS's
block-quantized kernels (`MatMulNBits`, the file's own 4-bit codes, see `ort_nbits`): measured
2.6x faster than the torch step with the same numerics (../shared/FINDINGS.md). This module
builds that graph from the loaded model and runs decode passes of up to `max_rows` requests
through it; every other pass (prefill, mixed, longer batches) stays on the torch path.

Memory stays ours. Attention is onnxruntime's `GroupQueryAttention` (RoPE at each row's
position, grouped heads, softmax over each row's own keys: ragged rows need no mask) over each
layer's past K/V in the runner's decode copies (`DecodeKV`: one (L, B, Hkv, C, D) buffer). Each
layer's past and present are bound to the same slice of it, so the op appends the step's K/V in
place; the runner then copies those rows into the pool. The binding is made once per copies
buffer, not per pass.

The graph itself, and which blocks it expresses (Llama's and its kin, Gemma's), is
`ort_graph`'s; `unsupported` says why a model keeps the torch step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.llama import LlamaForCausalLM
from sgl_lite.backend.runner.ort_graph import step_session, unsupported
from sgl_lite.backend.runner.weights.ort_nbits import return_freed_memory
from sgl_lite.backend.runner.weights.quant import GroupAffine
from sgl_lite.backend.types import ForwardOutput

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner.decode_kv import DecodeKV, KVView
    from sgl_lite.backend.types import Segment

logger = logging.getLogger("sgl_lite")

# The bound inputs' element types.
_NP = {torch.float32: np.float32, torch.int32: np.int32, torch.int64: np.int64}
# Passes of more new tokens than this (prompt chunks) hand their working memory back when they
# end: onnxruntime's arena and the C heap keep a 512-token pass's activations (~230 MB for a
# Llama-1B shape) for the process's life otherwise, under every later peak. A decode step's
# few rows keep theirs, as the next step reuses them.
SHRINK_AFTER_TOKENS = 64


class _StepInputs(NamedTuple):
    """The graph's small inputs, as buffers bound once and filled each pass."""

    x: torch.Tensor  # (T, hidden) float32: the new tokens' embeddings
    rows: torch.Tensor  # (3,) int64: B, S, -1 (the query's shape)
    seqlens: torch.Tensor  # (B,) int32
    total: torch.Tensor  # (1,) int32
    picked: torch.Tensor  # (R,) int64: the rows of x whose logits the pass wants


class OrtDecodeStep:
    """Decode passes of up to `max_rows` requests as one onnxruntime run (see the module doc)."""

    def __init__(self, session: Any, model: LlamaForCausalLM, max_rows: int, seconds: float):
        self.session = session
        self.model = model
        self.max_rows = max_rows
        self.build_seconds = seconds
        # Set where the model has no dense linears: the runner then sends every pass here
        # (prefill chunks one request at a time, decode rows in groups of `max_rows`).
        self.every_pass = False
        # Set beside dense weights that lose to the graph at any decode batch (float32 ones,
        # `graph_step.graph_beside`): larger decode batches run here in groups of `max_rows`.
        self.decode_groups = False
        config = model.config
        self.layers = config.num_hidden_layers
        self.kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.vocab = config.vocab_size
        self._bound: tuple[tuple[int, ...], Any, _StepInputs] | None = None
        import onnxruntime as ort

        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    @classmethod
    def build(
        cls,
        model: LlamaForCausalLM,
        codes: MutableMapping[str, GroupAffine],
        head: GroupAffine,
        threads: int,
        max_rows: int,
        consume: bool = False,
    ) -> OrtDecodeStep:
        """The step for `model` from its linears' codes (by "<layer>.<linear>") and the head's;
        raises if the model is not the plain Llama block or onnxruntime refuses the graph.
        `consume` empties `codes` as the graph takes them."""
        why = unsupported(model)
        if why:
            raise ValueError(f"the onnxruntime decode step cannot run this model: {why}")
        started = time.perf_counter()
        session = step_session(model, codes, head, threads, consume)
        return cls(session, model, max_rows, time.perf_counter() - started)

    def takes(self, segments: list[Segment]) -> bool:
        """Whether this pass is one the graph runs: up to `max_rows` single-token decodes, each
        wanting its logits, or one request's up to `max_rows` new tokens (a jump-forward chunk,
        a program's next step): onnxruntime's attention takes several new tokens in one row
        only."""
        if len(segments) == 1 and 1 < len(segments[0].token_ids) <= self.max_rows:
            return True
        return len(segments) <= self.max_rows and _decodes(segments)

    def takes_in_groups(self, segments: list[Segment]) -> bool:
        """Whether this pass runs here in groups of `max_rows` rows (`decode_groups`): more
        single-token decodes than one run takes, each wanting its logits."""
        return self.decode_groups and len(segments) > self.max_rows and _decodes(segments)

    @torch.inference_mode()
    def run(
        self, segments: list[Segment], pool: KVPool, decode_kv: DecodeKV
    ) -> ForwardOutput | None:
        """The pass's logits (the rows each segment asked for), its K/V written to the pool;
        None when the decode copies cannot hold this batch (the torch step runs it then)."""
        view = decode_kv.plan(segments, extend=True)
        if view is None or view.k_all.dtype != torch.float32:
            decode_kv.reset()
            return None
        try:
            return self._run(segments, pool, view)
        except BaseException:
            decode_kv.reset()  # the copies may be half-updated
            raise

    def _binding(
        self, view: KVView, batch: int, tokens: int, picked: int
    ) -> tuple[Any, _StepInputs]:
        """The IO binding for this batch's copies, made once per copies buffer and pass shape:
        binding every layer's past and present (4 per layer) costs ~1 ms of Python a pass,
        more than the attention itself. The small inputs are buffers the pass fills."""
        key = (batch, tokens, picked, view.capacity, view.k_all.data_ptr(), view.v_all.data_ptr())
        if self._bound is not None and self._bound[0] == key:
            return self._bound[1], self._bound[2]
        inputs = _StepInputs(
            torch.empty(tokens, self.model.config.hidden_size),
            torch.tensor([batch, tokens // batch, -1]),
            torch.empty(batch, dtype=torch.int32),
            torch.empty(1, dtype=torch.int32),
            torch.empty(picked, dtype=torch.int64),
        )
        binding = self.session.io_binding()
        for name, tensor in zip(_StepInputs._fields, inputs):
            dtype = _NP[tensor.dtype]
            binding.bind_input(name, "cpu", 0, dtype, list(tensor.shape), tensor.data_ptr())
        # Past and present share each layer's copy: the graph appends this pass's K/V there.
        for i, (k, v) in enumerate(zip(view.k, view.v)):
            for kind, tensor in (("k", k), ("v", v)):
                shape, ptr = list(tensor.shape), tensor.data_ptr()
                binding.bind_input(f"past_{kind}_{i}", "cpu", 0, np.float32, shape, ptr)
                binding.bind_output(f"present_{kind}_{i}", "cpu", 0, np.float32, shape, ptr)
        self._bound = (key, binding, inputs)
        return binding, inputs

    def _run(self, segments: list[Segment], pool: KVPool, view: KVView) -> ForwardOutput:
        batch = len(segments)
        ends = torch.tensor([s.end for s in segments])
        if view.fresh:  # every layer's prefix at once (the pass's own slots the graph writes)
            longest = int(ends.max())
            slots = torch.zeros(batch, longest, dtype=torch.long)
            for b, seg in enumerate(segments):
                slots[b, : seg.end] = seg.kv_slots
            shape = (self.layers, batch, longest, self.kv_heads, self.head_dim)
            for copy, source in ((view.k_all, pool.k), (view.v_all, pool.v)):
                gathered = source.index_select(1, slots.flatten()).view(shape)
                copy[:, :, :, :longest].copy_(gathered.transpose(2, 3))
        model = self.model
        ids = torch.tensor([t for s in segments for t in s.token_ids], dtype=torch.long)
        tokens = len(ids)
        # The rows whose logits the pass wants: each decode row's, or one request's from its
        # `logits_from` on (at least one row: the graph's head takes no empty batch).
        first = segments[0].logits_from if batch == 1 else 0
        picked = torch.arange(min(first, tokens - 1), tokens)
        binding, inputs = self._binding(view, batch, tokens, len(picked))
        inputs.x.copy_(model.embed_tokens(ids))
        inputs.seqlens.copy_(ends - 1)  # a row's keys before its last new token
        inputs.total.fill_(int(ends.max()))
        inputs.picked.copy_(picked)
        logits = torch.empty(len(picked), self.vocab)  # fresh each pass: callers may keep it
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.data_ptr())
        if tokens > SHRINK_AFTER_TOKENS:
            self.session.run_with_iobinding(binding, self._shrink)
            return_freed_memory()
        else:
            self.session.run_with_iobinding(binding)
        # The pool gets this pass's K/V rows, read back from where the graph put them.
        rows = (self.layers, -1, self.head_dim)
        kv_out = (self.layers, tokens, self.kv_heads, self.head_dim)
        new_k = view.k_all.view(rows).index_select(1, view.new_index).view(kv_out)
        new_v = view.v_all.view(rows).index_select(1, view.new_index).view(kv_out)
        out_slots = torch.cat([s.kv_slots[s.start :] for s in segments]).to(torch.long)
        pool.write_all_layers(out_slots, new_k, new_v)
        if pool.k.dtype != torch.float32:
            # The copies keep these rows as the pool keeps them (bf16-rounded). Otherwise later
            # steps would read float32 values until the next fresh gather, whose timing depends
            # on what ran before (the copies' size follows earlier batches): a greedy request
            # sent twice could then part.
            for copy, new in ((view.k_all, new_k), (view.v_all, new_v)):
                rounded = new.to(pool.k.dtype).to(torch.float32).view(rows)
                copy.view(rows).index_copy_(1, view.new_index, rounded)
        if batch == 1:  # one request's tokens: the rows it asked for (maybe none)
            return ForwardOutput(logits, [(first - int(picked[0]), len(picked))])
        return ForwardOutput(logits, [(b, b + 1) for b in range(batch)])


def _decodes(segments: list[Segment]) -> bool:
    """Whether every segment is a single-token decode wanting its logits."""
    return all(len(s.token_ids) == 1 and s.logits_from == 0 for s in segments)

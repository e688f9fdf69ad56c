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

The pre-norm decoder block is built with its linear biases (Qwen2) and q/k RMS norms (Qwen3
per head): Llama, Mistral within its window, Qwen2, Qwen3, SmolLM2. Any other model (Gemma's
block, OLMo 2's post-norms, Granite's multipliers, partial rotary) keeps the torch step, and
`unsupported` says why.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch

from sgl_lite.backend.runner.models.llama import DecoderLayer, LlamaForCausalLM, head_dim_of
from sgl_lite.backend.runner.weights import onnx_proto, ort_nbits
from sgl_lite.backend.runner.weights.quant import GroupAffine
from sgl_lite.backend.types import ForwardOutput

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner.decode_kv import DecodeKV, KVView
    from sgl_lite.backend.types import Segment

logger = logging.getLogger("sgl_lite")

# MatMulNBits' accuracy_level per 4-bit linear; the rest quantize activations to int8 (level
# 4), and so do all 8-bit linears (see `_Graph.linear`). 4-bit q/k/v take float32
# activations: int8 rounding of the projection's input reaches the attention scores through
# q.k over every key, and with it everywhere the embedded model's greedy decode parted from
# float32's on 2 of 64 tokens of the fixed test prompt (64/64 with float32 here; perplexity
# within 0.6 %). The projection is ~15 % of a layer's weights.
ACCURACY: dict[str, int] = {"qkv": 0}
# The bound inputs' element types.
_NP = {torch.float32: np.float32, torch.int32: np.int32, torch.int64: np.int64}


def unsupported(model: Any) -> str | None:
    """Why this model's decode step cannot be built as the graph, or None if it can."""
    if type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} has a block of its own"
    spec, config = model.spec, model.config
    if spec.multipliers or spec.norm_placement != "pre":
        return "the model's block differs from Llama's (multipliers or post-norm)"
    if getattr(model, "sliding_window", None) is not None:
        return "sliding-window attention"
    if model.rope.rotary_dim != head_dim_of(config):
        return "partial rotary embeddings"
    if head_dim_of(config) % 16:
        return "a head size that is not a multiple of 16 (onnxruntime's fused attention)"
    for layer in model.layers:
        if type(layer) is not DecoderLayer:
            return f"block {type(layer).__name__}"
    return None


class _Graph:
    """Builds the step's ONNX graph node by node, naming intermediate values uniquely."""

    def __init__(self) -> None:
        self.nodes: list[bytes] = []
        self.consts: dict[str, np.ndarray] = {}
        self._count = 0

    def name(self, hint: str) -> str:
        """A fresh value name."""
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, kind: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        """Adds one node with a single output; returns that output's name."""
        out = self.name(kind.lower())
        self.nodes.append(onnx_proto.node(kind, inputs, [out], domain, **attrs))
        return out

    def ops(self, kind: str, inputs: list[str], outputs: int, **attrs: Any) -> list[str]:
        """Adds one node with several outputs; returns their names."""
        outs = [self.name(kind.lower()) for _ in range(outputs)]
        self.nodes.append(onnx_proto.node(kind, inputs, outs, **attrs))
        return outs

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        """A constant (float32 or int64 as `array` is)."""
        name = self.name(hint)
        self.consts[name] = array
        return name

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant (shapes, axes, split sizes)."""
        return self.const(np.array(values, dtype=np.int64), "i")

    def linear(self, w: GroupAffine, x: str, hint: str, bias: torch.Tensor | None = None) -> str:
        """x (T, K) @ w^T (+ bias) on MatMulNBits → (T, N)."""
        y = self.name(hint)
        # 8-bit codes always take int8 activations: MLAS has no float32 kernel for them (its
        # fallback took 48 ms for an 8192 x 2048 matrix at batch 1 against 0.3 ms, measured).
        int8 = ort_nbits.ACCURACY_INT8
        accuracy = ACCURACY.get(hint, int8) if w.bits == 4 else int8
        nodes, consts = ort_nbits.linear_nodes(w, x, y, f"{y}.", accuracy)
        self.nodes += nodes
        self.consts.update(consts)
        if bias is None:
            return y
        return self.op("Add", [y, self.const(bias.detach().float().numpy(), "bias")])

    def rms_norm(self, x: str, weight: torch.Tensor, eps: float) -> str:
        """RMS norm over the last axis with `weight`."""
        scale = self.const(weight.detach().float().numpy(), "norm")
        return self.op("SimplifiedLayerNormalization", [x, scale], axis=-1, epsilon=eps)


def _normed_qk(g: _Graph, qkv: str, attn: Any, eps: float) -> str:
    """The fused projection's output (T, (H + 2 Hkv) D) with q and k RMS-normed as the model's
    `Attention._normed_qk` norms them: per head over D (Qwen3) or over each whole projection."""
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = g.ops("Split", [qkv, g.ints(heads * dim, kv_heads * dim, kv_heads * dim)], 3, axis=-1)
    normed = []
    for part, count, weight in ((q, heads, attn.q_norm), (k, kv_heads, attn.k_norm)):
        if attn.qk_norm == "head":
            per_head = g.op("Reshape", [part, g.ints(-1, count, dim)])  # (T, heads, D)
            per_head = g.rms_norm(per_head, weight, eps)
            normed.append(g.op("Reshape", [per_head, g.ints(-1, count * dim)]))
        else:
            normed.append(g.rms_norm(part, weight, eps))
    return g.op("Concat", [*normed, v], axis=-1)


def _step_session(
    model: LlamaForCausalLM,
    codes: dict[str, GroupAffine],
    head: GroupAffine,
    threads: int,
    consume: bool = False,
) -> Any:
    """The step's session: x (T, hidden) for the pass's T = B * S new tokens, rows (3,) int64
    (B, S, -1), seqlens (B,) int32 (each row's length after the pass, minus one), total (1,)
    int32 (the longest row after it), and per layer i past_k_i/past_v_i (B, Hkv, C, D) →
    logits (T, V) and present_k_i/present_v_i, bound to the past buffers. `consume` takes
    each linear's codes out of `codes` once packed into the graph (a load's peak memory)."""
    take = codes.pop if consume else codes.__getitem__
    config = model.config
    layers, hidden = config.num_hidden_layers, config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = head_dim_of(config)
    eps = float(config.rms_norm_eps)
    g = _Graph()
    half = dim // 2
    # GroupQueryAttention rotates by cos/sin caches (P, D/2); ours are (P, D) with the first
    # half of sin negated (models/rope.py), so its halves are our second halves.
    cos = g.const(model.rope.cos[:, :half].float().contiguous().numpy(), "cos")
    sin = g.const(model.rope.sin[:, half:].float().contiguous().numpy(), "sin")
    x = "x"
    for i, block in enumerate(model.layers):
        layer = cast(DecoderLayer, block)  # `unsupported` checked every block's type
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        h = g.rms_norm(x, norms[0], eps)
        attn_module = layer.self_attn
        qkv_linear = attn_module.qkv_proj
        qkv = g.linear(take(f"{i}.self_attn.qkv_proj"), h, "qkv", qkv_linear.bias)
        if attn_module.qk_norm is not None:  # Qwen3 (per head), OLMo 2's q/k (whole projection)
            qkv = _normed_qk(g, qkv, attn_module, eps=float(attn_module.eps))
        qkv = g.op("Reshape", [qkv, "rows"])  # (B, S, ...): S new tokens in each of B rows
        # onnxruntime's fused attention: RoPE on q and k at each row's position (its seqlens),
        # the new k/v written into the past buffer in place (present is bound to the same
        # memory), softmax over each row's own keys only (ragged rows need no mask).
        attn_inputs = [qkv, "", "", f"past_k_{i}", f"past_v_{i}", "seqlens", "total", cos, sin]
        attn = g.name("attn")
        g.nodes.append(
            onnx_proto.node(
                "GroupQueryAttention",
                attn_inputs,
                [attn, f"present_k_{i}", f"present_v_{i}"],
                "com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
                do_rotary=1,
                scale=float(dim**-0.5),
            )
        )
        attn = g.op("Reshape", [attn, g.ints(-1, heads * dim)])  # (T, H D)
        o_proj = attn_module.o_proj
        x = g.op("Add", [x, g.linear(take(f"{i}.self_attn.o_proj"), attn, "o", o_proj.bias)])
        h = g.rms_norm(x, norms[1], eps)
        mlp = layer.mlp
        fused = g.linear(take(f"{i}.mlp.gate_up_proj"), h, "gate_up", mlp.gate_up_proj.bias)
        width = layer.mlp.intermediate
        gate, up = g.ops("Split", [fused, g.ints(width, width)], 2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        down = g.linear(take(f"{i}.mlp.down_proj"), act, "down", mlp.down_proj.bias)
        x = g.op("Add", [x, down])
    # Only the rows whose logits the pass wants reach the head: a prompt's chunk of S tokens
    # wants one or none, and the head is the step's widest linear.
    final = g.op("Gather", [g.rms_norm(x, model.norm, eps), "picked"], axis=0)  # (R, hidden)
    g.nodes.append(onnx_proto.node("Identity", [g.linear(head, final, "head")], ["logits"]))
    f, i32 = onnx_proto.FLOAT, onnx_proto.ELEM_TYPES[np.dtype(np.int32)]
    kv_shape: list[int | str] = ["B", kv_heads, "C", dim]
    inputs = [
        onnx_proto.value_info("x", f, ["T", hidden]),
        onnx_proto.value_info("rows", onnx_proto.ELEM_TYPES[np.dtype(np.int64)], [3]),
        onnx_proto.value_info("seqlens", i32, ["B"]),
        onnx_proto.value_info("total", i32, [1]),
        onnx_proto.value_info("picked", onnx_proto.ELEM_TYPES[np.dtype(np.int64)], ["R"]),
    ]
    outputs = [onnx_proto.value_info("logits", f, ["R", head.q.shape[0]])]
    for i in range(layers):
        inputs += [onnx_proto.value_info(f"past_{kv}_{i}", f, kv_shape) for kv in "kv"]
        outputs += [onnx_proto.value_info(f"present_{kv}_{i}", f, kv_shape) for kv in "kv"]
    return ort_nbits.make_session(g.nodes, g.consts, inputs, outputs, threads)


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
        config = model.config
        self.layers = config.num_hidden_layers
        self.kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.vocab = config.vocab_size
        self._bound: tuple[tuple[int, ...], Any, _StepInputs] | None = None

    @classmethod
    def build(
        cls,
        model: LlamaForCausalLM,
        codes: dict[str, GroupAffine],
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
        session = _step_session(model, codes, head, threads, consume)
        return cls(session, model, max_rows, time.perf_counter() - started)

    def takes(self, segments: list[Segment]) -> bool:
        """Whether this pass is one the graph runs: up to `max_rows` single-token decodes, each
        wanting its logits, or one request's up to `max_rows` new tokens (a jump-forward chunk,
        a program's next step): onnxruntime's attention takes several new tokens in one row
        only."""
        if len(segments) == 1 and 1 < len(segments[0].token_ids) <= self.max_rows:
            return True
        return len(segments) <= self.max_rows and all(
            len(s.token_ids) == 1 and s.logits_from == 0 for s in segments
        )

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
            # on what ran before (the copies' capacity only grows): a greedy request sent twice
            # could then part.
            for copy, new in ((view.k_all, new_k), (view.v_all, new_v)):
                rounded = new.to(pool.k.dtype).to(torch.float32).view(rows)
                copy.view(rows).index_copy_(1, view.new_index, rounded)
        if model.logits_scaling != 1.0:
            logits = logits / model.logits_scaling
        if batch == 1:  # one request's tokens: the rows it asked for (maybe none)
            return ForwardOutput(logits, [(first - int(picked[0]), len(picked))])
        return ForwardOutput(logits, [(b, b + 1) for b in range(batch)])

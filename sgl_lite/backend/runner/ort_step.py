"""The fast mode's decode step on CPU as one onnxruntime graph, from embedding to logits.

A batch-1 decode step of a small model is ~850 tiny torch ops; each pays a dispatch and, with a
2-thread OpenMP team, a barrier. onnxruntime runs the same step as one graph on MLAS's
block-quantized kernels (`MatMulNBits`, the file's own 4-bit codes, see `ort_nbits`): measured
2.6x faster than the torch step with the same numerics (../shared/FINDINGS.md). This module
builds that graph from the loaded model and runs decode passes of up to `max_rows` requests
through it; every other pass (prefill, mixed, longer batches) stays on the torch path.

Memory stays ours. The graph reads each layer's past K/V from the runner's decode copies
(`DecodeKV`: one (L, B, Hkv, C, D) buffer, bound without a copy) and returns the step's new K/V
(L, B, Hkv, D); the runner writes those to the pool and appends them to the copies. Rows of
different lengths share the buffer: an additive mask hides each row's keys past its own length
(and the position of this step's token, which the graph attends to from its own output).

Only the plain Llama block is built (pre-norm, full RoPE, no biases, q/k norms or multipliers:
Llama, Mistral within its window, Qwen2 without biases, SmolLM2); any other model keeps the
torch step, and `unsupported` says why.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

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

# MatMulNBits' accuracy_level per linear; the rest quantize activations to int8 (level 4).
# q/k/v take float32 activations: int8 rounding of the projection's input reaches the
# attention scores through q.k over every key, and with it everywhere the embedded model's
# greedy decode parted from float32's on 2 of 64 tokens of the fixed test prompt (64/64 with
# float32 here; perplexity within 0.6 %). The projection is ~15 % of a layer's weights.
ACCURACY: dict[str, int] = {"qkv": 0}


def unsupported(model: Any) -> str | None:
    """Why this model's decode step cannot be built as the graph, or None if it can."""
    if type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} has a block of its own"
    spec, config = model.spec, model.config
    if spec.qk_norm is not None or spec.multipliers or spec.norm_placement != "pre":
        return "the model's block differs from Llama's (q/k norms, multipliers or post-norm)"
    if getattr(model, "sliding_window", None) is not None:
        return "sliding-window attention"
    if model.rope.rotary_dim != head_dim_of(config):
        return "partial rotary embeddings"
    for layer in model.layers:
        if type(layer) is not DecoderLayer:
            return f"block {type(layer).__name__}"
        linears = [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
        linears += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
        if any(linear.bias is not None for linear in linears):
            return "linear biases"
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

    def linear(self, w: GroupAffine, x: str, hint: str) -> str:
        """x (T, K) @ w^T on MatMulNBits → (T, N)."""
        y = self.name(hint)
        accuracy = ACCURACY.get(hint, ort_nbits.ACCURACY_INT8)
        nodes, consts = ort_nbits.linear_nodes(w, x, y, f"{y}.", accuracy)
        self.nodes += nodes
        self.consts.update(consts)
        return y

    def rms_norm(self, x: str, weight: torch.Tensor, eps: float) -> str:
        """RMS norm over the last axis with `weight`."""
        scale = self.const(weight.detach().float().numpy(), "norm")
        return self.op("SimplifiedLayerNormalization", [x, scale], axis=-1, epsilon=eps)


def _step_session(
    model: LlamaForCausalLM, codes: dict[str, GroupAffine], head: GroupAffine, threads: int
) -> Any:
    """The decode step's session: x (B, hidden), cos/sin (B, 1, D), mask (B, 1, 1, C + 1),
    past_k/past_v (L, B, Hkv, C, D) → logits (B, V), new_k/new_v (L, B, Hkv, D)."""
    config = model.config
    layers, hidden = config.num_hidden_layers, config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim, group = head_dim_of(config), heads // kv_heads
    eps = float(config.rms_norm_eps)
    g = _Graph()
    half = dim // 2
    new_ks: list[str] = []
    new_vs: list[str] = []
    x = "x"
    scale = g.const(np.array(dim**-0.5, dtype=np.float32), "scale")
    for i, block in enumerate(model.layers):
        layer = cast(DecoderLayer, block)  # `unsupported` checked every block's type
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        h = g.rms_norm(x, norms[0], eps)
        qkv = g.linear(codes[f"{i}.self_attn.qkv_proj"], h, "qkv")  # (B, (H + 2Hkv) D)
        qkv = g.op("Reshape", [qkv, g.ints(0, heads + 2 * kv_heads, dim)])
        qk, v = g.ops("Split", [qkv, g.ints(heads + kv_heads, kv_heads)], 2, axis=1)
        # RoPE on q and k together: x * cos + roll(x, D/2) * signed sin (models/rope.py).
        low, high = g.ops("Split", [qk, g.ints(half, half)], 2, axis=-1)
        rolled = g.op("Concat", [high, low], axis=-1)
        qk = g.op("Add", [g.op("Mul", [qk, "cos"]), g.op("Mul", [rolled, "sin"])])
        q, k = g.ops("Split", [qk, g.ints(heads, kv_heads)], 2, axis=1)  # (B, H|Hkv, D)
        new_ks.append(g.op("Unsqueeze", [k, g.ints(0)]))  # (1, B, Hkv, D)
        new_vs.append(g.op("Unsqueeze", [v, g.ints(0)]))
        index = g.const(np.array(i, dtype=np.int64), "layer")
        # This layer's past keys (B, Hkv, C, D) and the step's own as the last one.
        keys, values = (
            g.op(
                "Concat",
                [g.op("Gather", [past, index]), g.op("Unsqueeze", [new, g.ints(2)])],
                axis=2,
            )
            for past, new in (("past_k", k), ("past_v", v))
        )
        # The G query heads of a KV head as G query rows: (B, Hkv, G, D) against (B, Hkv, C+1).
        q = g.op("Reshape", [q, g.ints(0, kv_heads, group, dim)])
        scores = g.op("MatMul", [q, g.op("Transpose", [keys], perm=[0, 1, 3, 2])])
        scores = g.op("Add", [g.op("Mul", [scores, scale]), "mask"])
        attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), values])  # (B, Hkv, G, D)
        attn = g.op("Reshape", [attn, g.ints(0, heads * dim)])
        x = g.op("Add", [x, g.linear(codes[f"{i}.self_attn.o_proj"], attn, "o")])
        h = g.rms_norm(x, norms[1], eps)
        fused = g.linear(codes[f"{i}.mlp.gate_up_proj"], h, "gate_up")
        width = layer.mlp.intermediate
        gate, up = g.ops("Split", [fused, g.ints(width, width)], 2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, g.linear(codes[f"{i}.mlp.down_proj"], act, "down")])
    final = g.rms_norm(x, model.norm, eps)
    g.nodes += [
        onnx_proto.node("Identity", [g.linear(head, final, "head")], ["logits"]),
        onnx_proto.node("Concat", new_ks, ["new_k"], axis=0),
        onnx_proto.node("Concat", new_vs, ["new_v"], axis=0),
    ]
    f = onnx_proto.FLOAT
    vocab = head.q.shape[0]
    kv_shape = [layers, "B", kv_heads, "C", dim]
    inputs = [
        onnx_proto.value_info("x", f, ["B", hidden]),
        onnx_proto.value_info("cos", f, ["B", 1, dim]),
        onnx_proto.value_info("sin", f, ["B", 1, dim]),
        onnx_proto.value_info("mask", f, ["B", 1, 1, "C1"]),
        onnx_proto.value_info("past_k", f, kv_shape),
        onnx_proto.value_info("past_v", f, kv_shape),
    ]
    outputs = [
        onnx_proto.value_info("logits", f, ["B", vocab]),
        onnx_proto.value_info("new_k", f, [layers, "B", kv_heads, dim]),
        onnx_proto.value_info("new_v", f, [layers, "B", kv_heads, dim]),
    ]
    return ort_nbits.make_session(g.nodes, g.consts, inputs, outputs, threads)


class OrtDecodeStep:
    """Decode passes of up to `max_rows` requests as one onnxruntime run (see the module doc)."""

    def __init__(self, session: Any, model: LlamaForCausalLM, max_rows: int, seconds: float):
        self.session = session
        self.model = model
        self.max_rows = max_rows
        self.build_seconds = seconds
        config = model.config
        self.layers = config.num_hidden_layers
        self.kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.vocab = config.vocab_size

    @classmethod
    def build(
        cls,
        model: LlamaForCausalLM,
        codes: dict[str, GroupAffine],
        head: GroupAffine,
        threads: int,
        max_rows: int,
    ) -> OrtDecodeStep:
        """The step for `model` from its linears' codes (by "<layer>.<linear>") and the head's;
        raises if the model is not the plain Llama block or onnxruntime refuses the graph."""
        why = unsupported(model)
        if why:
            raise ValueError(f"the onnxruntime decode step cannot run this model: {why}")
        started = time.perf_counter()
        session = _step_session(model, codes, head, threads)
        return cls(session, model, max_rows, time.perf_counter() - started)

    def takes(self, segments: list[Segment]) -> bool:
        """Whether this pass is one the graph runs: single-token decodes, each wanting its
        logits, at most `max_rows` of them."""
        return len(segments) <= self.max_rows and all(
            len(s.token_ids) == 1 and s.logits_from == 0 for s in segments
        )

    @torch.inference_mode()
    def run(
        self, segments: list[Segment], pool: KVPool, decode_kv: DecodeKV
    ) -> ForwardOutput | None:
        """The pass's logits (one row per segment), its K/V written to the pool; None when the
        decode copies cannot hold this batch (the torch step runs it then)."""
        view = decode_kv.plan(segments)
        if view is None or view.k_all.dtype != torch.float32:
            decode_kv.reset()
            return None
        try:
            return self._run(segments, pool, view)
        except BaseException:
            decode_kv.reset()  # the copies may be half-updated
            raise

    def _run(self, segments: list[Segment], pool: KVPool, view: KVView) -> ForwardOutput:
        batch, capacity = len(segments), view.capacity
        ends = torch.tensor([s.end for s in segments])
        if view.fresh:  # every layer's prefix at once; this step's own slot is masked below
            longest = int(ends.max())
            slots = torch.zeros(batch, longest, dtype=torch.long)
            for b, seg in enumerate(segments):
                slots[b, : seg.end] = seg.kv_slots
            shape = (self.layers, batch, longest, self.kv_heads, self.head_dim)
            for copy, source in ((view.k_all, pool.k), (view.v_all, pool.v)):
                gathered = source.index_select(1, slots.flatten()).view(shape)
                copy[:, :, :, :longest].copy_(gathered.transpose(2, 3))
        model = self.model
        ids = torch.tensor([s.token_ids[0] for s in segments], dtype=torch.long)
        x = model.embed_tokens(ids).float().contiguous()
        positions = ends - 1
        cos, sin = model.rope.tables(positions, torch.float32)
        cos, sin = cos.contiguous(), sin.contiguous()
        # Keys [0, end - 1) of each row, and the step's own (last, from the graph's output).
        keys = torch.arange(capacity + 1)
        seen = (keys[None, :] < positions[:, None]) | (keys[None, :] == capacity)
        mask = torch.zeros(batch, 1, 1, capacity + 1)
        mask.masked_fill_(~seen[:, None, None, :], float("-inf"))
        logits = torch.empty(batch, self.vocab)
        kv_out = (self.layers, batch, self.kv_heads, self.head_dim)
        new_k, new_v = torch.empty(kv_out), torch.empty(kv_out)
        binding = self.session.io_binding()
        for name, tensor in (
            ("x", x),
            ("cos", cos),
            ("sin", sin),
            ("mask", mask),
            ("past_k", view.k_all),
            ("past_v", view.v_all),
        ):
            binding.bind_input(name, "cpu", 0, np.float32, list(tensor.shape), tensor.data_ptr())
        for name, tensor in (("logits", logits), ("new_k", new_k), ("new_v", new_v)):
            binding.bind_output(name, "cpu", 0, np.float32, list(tensor.shape), tensor.data_ptr())
        self.session.run_with_iobinding(binding)
        # The copies gain this step's row at each row's last position; the pool its slot.
        rows = (self.layers, -1, self.head_dim)
        flat = (self.layers, batch * self.kv_heads, self.head_dim)
        view.k_all.view(rows).index_copy_(1, view.new_index, new_k.view(flat))
        view.v_all.view(rows).index_copy_(1, view.new_index, new_v.view(flat))
        out_slots = torch.stack([s.kv_slots[-1] for s in segments]).to(torch.long)
        pool.write_all_layers(out_slots, new_k, new_v)
        if model.logits_scaling != 1.0:
            logits = logits / model.logits_scaling
        return ForwardOutput(logits, [(b, b + 1) for b in range(batch)])

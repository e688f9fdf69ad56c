"""The onnxruntime step's graph: a loaded model's whole forward, embeddings in, logits out.

Built node by node from the model's modules and its linears' file codes (`MatMulNBits`, see
`ort_nbits`); `ort_step.OrtDecodeStep` runs it. Two block shapes are expressed:

- Llama's block, with linear biases (Qwen2), q/k RMS norms (Qwen3 per head, OLMo 2 over the
  whole projection), Granite's multipliers (embeddings, attention scale, each sublayer's output
  before the residual add, logits) and OLMo 2's post-norms (each sublayer's output normed
  before the residual add, no pre-norms): Llama, Mistral within its window, Qwen2, Qwen3,
  Phi-3, Granite, OLMo 2, SmolLM2;
- Gemma's (1, 2 and 3 text): embeddings scaled by sqrt(hidden), RMS norms with weight (1 + w),
  Gemma 2/3's norms after attention and around the feed-forward, GELU, Gemma 3's per-head
  q/k norms, sliding-window layers with their own RoPE base, soft-capped scores and logits.

Attention is onnxruntime's `GroupQueryAttention` over each layer's past K/V (RoPE at each row's
position, grouped heads, softmax over each row's own keys, a sliding window where the layer has
one). Anything else (partial rotary, a head size onnxruntime's fused attention does not take)
keeps the torch step, and `unsupported` says why.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, cast

import numpy as np
import torch

from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.gemma import GemmaDecoderLayer, GemmaForCausalLM
from sgl_lite.backend.runner.models.llama import (
    DecoderLayer,
    LlamaForCausalLM,
    PostNormDecoderLayer,
    ScaledResidualLayer,
)
from sgl_lite.backend.runner.weights import onnx_proto, ort_nbits
from sgl_lite.backend.runner.weights.quant import GroupAffine

# Gemma's activations by transformers' names: onnxruntime's tanh-approximated GELU, or ONNX's.
GELU_OPS = {
    "gelu_pytorch_tanh": ("FastGelu", "com.microsoft"),
    "gelu_new": ("FastGelu", "com.microsoft"),
    "gelu": ("Gelu", ""),
}

# The shared decoder's blocks `_llama_block` expresses (models/llama.py `layer_class`).
LLAMA_BLOCKS = (DecoderLayer, ScaledResidualLayer, PostNormDecoderLayer)


def unsupported(model: Any) -> str | None:
    """Why this model's step cannot be built as the graph, or None if it can."""
    config = model.config
    if type(model) is GemmaForCausalLM:
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in GELU_OPS:
            return f"Gemma's activation {act!r}"
    elif type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} has a block of its own"
    else:
        if getattr(model, "sliding_window", None) is not None:
            return "sliding-window attention"
        for layer in model.layers:
            if type(layer) not in LLAMA_BLOCKS:
                return f"block {type(layer).__name__}"
    if model.rope.rotary_dim != head_dim_of(config):
        return "partial rotary embeddings"
    if head_dim_of(config) % 16:
        return "a head size that is not a multiple of 16 (onnxruntime's fused attention)"
    return None


class Graph:
    """Builds an ONNX graph node by node, naming intermediate values uniquely."""

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

    def scalar(self, value: float) -> str:
        """A float32 scalar constant."""
        return self.const(np.array(value, dtype=np.float32), "s")

    def linear(self, w: GroupAffine, x: str, hint: str, bias: torch.Tensor | None = None) -> str:
        """x (T, K) @ w^T (+ bias) on MatMulNBits → (T, N); a matrix fused from parts of
        different formats as one MatMulNBits per run of like parts, joined (`format_runs`)."""
        pieces = []
        for run in w.format_runs():
            piece = self.name(hint)
            nodes, consts = ort_nbits.linear_nodes(run, x, piece, f"{piece}.")
            self.nodes += nodes
            self.consts.update(consts)
            pieces.append(piece)
        y = pieces[0] if len(pieces) == 1 else self.op("Concat", pieces, axis=-1)
        if bias is None:
            return y
        return self.op("Add", [y, self.const(bias.detach().float().numpy(), "bias")])

    def rms_norm(self, x: str, weight: torch.Tensor | np.ndarray, eps: float) -> str:
        """RMS norm over the last axis with `weight`."""
        w = weight if isinstance(weight, np.ndarray) else weight.detach().float().numpy()
        return self.op("SimplifiedLayerNormalization", [x, self.const(w, "norm")], axis=-1,
                       epsilon=eps)  # fmt: skip

    def softcap(self, x: str, cap: float) -> str:
        """tanh(x / cap) * cap."""
        return self.op("Mul", [self.op("Tanh", [self.op("Div", [x, self.scalar(cap)])]),
                               self.scalar(cap)])  # fmt: skip


def _gemma_weight(weight: torch.Tensor) -> np.ndarray:
    """A Gemma norm's effective weight: it scales by (1 + w)."""
    return (1.0 + weight.detach().float()).numpy()


def _normed_qk(g: Graph, qkv: str, attn: Any, eps: float, gemma: bool = False) -> str:
    """The fused projection's output (T, (H + 2 Hkv) D) with q and k RMS-normed as the model's
    attention norms them: per head over D (Qwen3, Gemma 3) or over each whole projection."""
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = g.ops("Split", [qkv, g.ints(heads * dim, kv_heads * dim, kv_heads * dim)], 3, axis=-1)
    normed = []
    for part, count, weight in ((q, heads, attn.q_norm), (k, kv_heads, attn.k_norm)):
        w = _gemma_weight(weight) if gemma else weight
        if attn.qk_norm == "head":
            per_head = g.op("Reshape", [part, g.ints(-1, count, dim)])  # (T, heads, D)
            per_head = g.rms_norm(per_head, w, eps)
            normed.append(g.op("Reshape", [per_head, g.ints(-1, count * dim)]))
        else:
            normed.append(g.rms_norm(part, w, eps))
    return g.op("Concat", [*normed, v], axis=-1)


def _attention(
    g: Graph,
    i: int,
    qkv: str,
    attn: Any,
    rope: tuple[str, str],
    window: int | None = None,
) -> str:
    """onnxruntime's fused attention of layer `i` over (B, S, ...) q/k/v rows → (T, H D): RoPE
    on q and k at each row's position (its seqlens), the new k/v written into the past buffer in
    place (present is bound to the same memory), softmax over each row's own keys only (ragged
    rows need no mask), within the last `window` keys where given."""
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    scale = attn.scale if attn.scale is not None else dim**-0.5
    extra: dict[str, Any] = {}
    if getattr(attn, "softcap", None):
        extra["softcap"] = float(attn.softcap)
    if window is not None:
        extra["local_window_size"] = int(window)
    out = g.name("attn")
    g.nodes.append(
        onnx_proto.node(
            "GroupQueryAttention",
            [qkv, "", "", f"past_k_{i}", f"past_v_{i}", "seqlens", "total", *rope],
            [out, f"present_k_{i}", f"present_v_{i}"],
            "com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
            do_rotary=1,
            scale=float(scale),
            **extra,
        )
    )
    return g.op("Reshape", [out, g.ints(-1, heads * dim)])  # (T, H D)


def _llama_block(
    g: Graph, i: int, layer: DecoderLayer, x: str, take: Any, rope: tuple[str, str], eps: float
) -> str:
    """The shared decoder's block on x (T, hidden): Llama's pre-norm one (with Qwen2's biases
    and Qwen3's q/k norms), Granite's with each sublayer's output scaled, or OLMo 2's, which
    norms each sublayer's output instead of its input (see `models/llama.py`)."""
    attn, mlp = layer.self_attn, layer.mlp
    post = isinstance(layer, PostNormDecoderLayer)
    scale = getattr(layer, "residual_multiplier", 1.0)

    def add(residual: str, out: str, norm: str) -> str:
        # OLMo 2: out RMS-normed by its post-norm `norm`; Granite: out times residual_multiplier
        # (the torch block's order); Llama: out as it is.
        if post:
            out = g.rms_norm(out, getattr(layer, norm), eps)
        if scale != 1.0:
            out = g.op("Mul", [out, g.scalar(scale)])
        return g.op("Add", [residual, out])

    h = x if post else g.rms_norm(x, layer.input_layernorm, eps)
    qkv = g.linear(take(f"{i}.self_attn.qkv_proj"), h, "qkv", attn.qkv_proj.bias)
    if attn.qk_norm is not None:  # Qwen3 (per head), OLMo 2's q/k (whole projection)
        qkv = _normed_qk(g, qkv, attn, eps=float(attn.eps))
    out = _attention(g, i, g.op("Reshape", [qkv, "rows"]), attn, rope)
    o = g.linear(take(f"{i}.self_attn.o_proj"), out, "o", attn.o_proj.bias)
    x = add(x, o, "post_attention_layernorm")
    h = x if post else g.rms_norm(x, layer.post_attention_layernorm, eps)
    fused = g.linear(take(f"{i}.mlp.gate_up_proj"), h, "gate_up", mlp.gate_up_proj.bias)
    gate, up = g.ops("Split", [fused, g.ints(mlp.intermediate, mlp.intermediate)], 2, axis=-1)
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
    down = g.linear(take(f"{i}.mlp.down_proj"), act, "down", mlp.down_proj.bias)
    return add(x, down, "post_feedforward_layernorm")


def _gemma_block(
    g: Graph,
    i: int,
    layer: GemmaDecoderLayer,
    x: str,
    take: Any,
    rope: tuple[str, str],
    window: int | None,
    act: str,
) -> str:
    """Gemma's block (see `models/gemma.py`) on x (T, hidden)."""
    eps, attn = float(layer.eps), layer.self_attn

    def norm(value: str, weight: torch.Tensor) -> str:
        return g.rms_norm(value, _gemma_weight(weight), eps)

    qkv = g.linear(take(f"{i}.self_attn.qkv_proj"), norm(x, layer.input_layernorm), "qkv",
                   attn.qkv_proj.bias)  # fmt: skip
    if attn.qk_norm:  # Gemma 3: each q and k head, before RoPE
        qkv = _normed_qk(g, qkv, attn, eps=float(attn.eps), gemma=True)
    out = _attention(g, i, g.op("Reshape", [qkv, "rows"]), attn, rope, window)
    h = g.linear(take(f"{i}.self_attn.o_proj"), out, "o", attn.o_proj.bias)
    mlp = layer.mlp
    op, domain = GELU_OPS[act]

    def feed_forward(value: str) -> str:
        fused = g.linear(take(f"{i}.mlp.gate_up_proj"), value, "gate_up", mlp.gate_up_proj.bias)
        gate, up = g.ops("Split", [fused, g.ints(mlp.intermediate, mlp.intermediate)], 2, axis=-1)
        product = g.op("Mul", [g.op(op, [gate], domain), up])
        return g.linear(take(f"{i}.mlp.down_proj"), product, "down", mlp.down_proj.bias)

    if not layer.sandwich:  # Gemma 1: Llama's block
        x = g.op("Add", [x, h])
        return g.op("Add", [x, feed_forward(norm(x, layer.post_attention_layernorm))])
    x = g.op("Add", [x, norm(h, layer.post_attention_layernorm)])
    h = feed_forward(norm(x, layer.pre_feedforward_layernorm))
    return g.op("Add", [x, norm(h, layer.post_feedforward_layernorm)])


def _rope_caches(g: Graph, rope: Any) -> tuple[str, str]:
    """GroupQueryAttention's cos/sin caches (P, D/2) from our tables (P, D), whose first half
    of sin is negated (models/rope.py): its halves are our second halves."""
    half = rope.cos.shape[-1] // 2
    cos = g.const(rope.cos[:, :half].float().contiguous().numpy(), "cos")
    sin = g.const(rope.sin[:, half:].float().contiguous().numpy(), "sin")
    return cos, sin


def step_session(
    model: LlamaForCausalLM,
    codes: MutableMapping[str, GroupAffine],
    head: GroupAffine,
    threads: int,
    consume: bool = False,
) -> Any:
    """The step's session: x (T, hidden) for the pass's T = B * S new tokens' embeddings, rows
    (3,) int64 (B, S, -1), seqlens (B,) int32 (each row's length after the pass, minus one),
    total (1,) int32 (the longest row after it), picked (R,) int64 (the rows whose logits are
    wanted), and per layer i past_k_i/past_v_i (B, Hkv, C, D) → logits (R, V) and
    present_k_i/present_v_i, bound to the past buffers. `consume` takes each linear's codes out
    of `codes` once packed into the graph (a load's peak memory)."""
    take = codes.pop if consume else codes.__getitem__
    config = model.config
    layers, hidden = config.num_hidden_layers, config.hidden_size
    kv_heads, dim = config.num_key_value_heads, head_dim_of(config)
    eps = float(config.rms_norm_eps)
    g = Graph()
    rope = _rope_caches(g, model.rope)
    x = "x"
    if isinstance(model, GemmaForCausalLM):
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        local = _rope_caches(g, model.rope_local) if model.rope_local is not None else rope
        x = g.op("Mul", [x, g.scalar(float(cast(torch.Tensor, model.embed_scale)))])
        for i, block in enumerate(model.layers):
            layer = cast(GemmaDecoderLayer, block)
            window = model.sliding_window if layer.sliding else None
            x = _gemma_block(g, i, layer, x, take, local if layer.sliding else rope, window, act)
        final = g.rms_norm(x, _gemma_weight(model.norm), eps)
    else:
        if model.embedding_multiplier != 1.0:  # Granite
            x = g.op("Mul", [x, g.scalar(model.embedding_multiplier)])
        for i, block in enumerate(model.layers):
            x = _llama_block(g, i, cast(DecoderLayer, block), x, take, rope, eps)
        final = g.rms_norm(x, model.norm, eps)
    # Only the rows whose logits the pass wants reach the head: a prompt's chunk of S tokens
    # wants one or none, and the head is the step's widest linear.
    final = g.op("Gather", [final, "picked"], axis=0)  # (R, hidden)
    logits = g.linear(head, final, "head")
    softcap = getattr(model, "final_softcap", None)
    if softcap:
        logits = g.softcap(logits, float(softcap))
    if model.logits_scaling != 1.0:  # Granite
        logits = g.op("Div", [logits, g.scalar(model.logits_scaling)])
    g.nodes.append(onnx_proto.node("Identity", [logits], ["logits"]))
    f, i32 = onnx_proto.FLOAT, onnx_proto.ELEM_TYPES[np.dtype(np.int32)]
    i64 = onnx_proto.ELEM_TYPES[np.dtype(np.int64)]
    kv_shape: list[int | str] = ["B", kv_heads, "C", dim]
    inputs = [
        onnx_proto.value_info("x", f, ["T", hidden]),
        onnx_proto.value_info("rows", i64, [3]),
        onnx_proto.value_info("seqlens", i32, ["B"]),
        onnx_proto.value_info("total", i32, [1]),
        onnx_proto.value_info("picked", i64, ["R"]),
    ]
    outputs = [onnx_proto.value_info("logits", f, ["R", head.q.shape[0]])]
    for i in range(layers):
        inputs += [onnx_proto.value_info(f"past_{kv}_{i}", f, kv_shape) for kv in "kv"]
        outputs += [onnx_proto.value_info(f"present_{kv}_{i}", f, kv_shape) for kv in "kv"]
    return ort_nbits.make_session(g.nodes, g.consts, inputs, outputs, threads)

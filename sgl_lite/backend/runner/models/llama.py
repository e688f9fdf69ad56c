"""The shared decoder forward pass in plain torch over the token-slot KV pool.

Llama, Mistral and Qwen2 run it as it is; Qwen3, OLMo 2, Granite and Phi-3 differ from it only
by the switches of their `DecoderSpec` (spec.py; the registry is `models/__init__.py`).

One call serves a mixed batch: prefill chunks of several requests, each attending to its cached
prefix plus itself causally, and single decode tokens. Tokens of all requests are flattened to
one (T, hidden) matrix for every projection; only attention (attention.py) regroups them per
request, gathering each request's K/V from the pool by slot id. The model never sees requests,
only tensors.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.models.attention import Attention, head_dim_of
from sgl_lite.backend.runner.models.checkpoint import ModelLoadError, WeightSource, load_checked
from sgl_lite.backend.runner.models.metadata import AttentionMetadata
from sgl_lite.backend.runner.models.rope import RotaryEmbedding
from sgl_lite.backend.runner.models.spec import LLAMA, DecoderSpec
from sgl_lite.backend.runner.weights import onednn
from sgl_lite.backend.runner.weights.embedding import FileEmbedding
from sgl_lite.backend.runner.weights.linear import Linear, dense_linear
from sgl_lite.backend.runner.weights.quant import PackedWeight


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    ACTIVATIONS: tuple[str, ...] = ("silu", "swish")  # what `forward` computes; () = any

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if self.ACTIVATIONS and act not in self.ACTIVATIONS:
            raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported; use silu")
        bias = bool(getattr(config, "mlp_bias", False))
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, bias=bias)
        self.down_proj = Linear(self.intermediate, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, use_int: bool = False, cast_back: bool = True):
        """x: (T, hidden) → (T, hidden); `cast_back` as in `Linear.run`, for down_proj."""
        fused = self.gate_up_proj.run(x, use_int, cast_back=False)
        gate, up = fused.split(self.intermediate, dim=-1)
        # silu in the activation dtype; the product promotes `up` (the same bits as a cast).
        act = F.silu(gate if gate.dtype == x.dtype else gate.to(x.dtype)) * up
        return self.down_proj.run(act, use_int, cast_back)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block (Llama, Qwen, Phi-3)."""

    norm_names = ("input_layernorm", "post_attention_layernorm")  # as in the checkpoint
    # Set by name in __init__ (the norms differ by block); declared for the type checker.
    input_layernorm: nn.Parameter
    post_attention_layernorm: nn.Parameter

    def __init__(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec = LLAMA) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        for name in self.norm_names:
            setattr(self, name, nn.Parameter(torch.ones(config.hidden_size)))
        self.self_attn = Attention(config, layer_id, spec)
        self.mlp = MLP(config)

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden); this layer's K/V go to the pool."""
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        # .forward: no hook machinery per call. The sublayers' int-path outputs stay bf16: the
        # residual add widens them (cast_back=False saves a cast per sublayer).
        x = x + self.self_attn.forward(h, meta, pool, cast_back=False)
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp.forward(h, meta.use_int, cast_back=False)


class ScaledResidualLayer(DecoderLayer):
    """Pre-norm block whose sublayer outputs are scaled before the residual add (Granite)."""

    def __init__(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec = LLAMA) -> None:
        super().__init__(config, layer_id, spec)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden)."""
        m = self.residual_multiplier
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        x = x + self.self_attn.forward(h, meta, pool) * m
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp.forward(h, meta.use_int) * m


class PostNormDecoderLayer(DecoderLayer):
    """Block that norms each sublayer's output instead of its input (OLMo 2)."""

    norm_names = ("post_attention_layernorm", "post_feedforward_layernorm")
    post_feedforward_layernorm: nn.Parameter

    def forward(self, x, meta, pool):
        """x: (T, hidden) → (T, hidden)."""
        h = self.self_attn.forward(x, meta, pool)
        x = x + F.rms_norm(h, h.shape[-1:], self.post_attention_layernorm, self.eps)
        h = self.mlp.forward(x, meta.use_int)
        return x + F.rms_norm(h, h.shape[-1:], self.post_feedforward_layernorm, self.eps)


def layer_class(spec: DecoderSpec) -> type[DecoderLayer]:
    """The block a spec calls for; plain Llama's does no work beyond Llama's."""
    if spec.norm_placement == "post":
        return PostNormDecoderLayer
    return ScaledResidualLayer if spec.multipliers else DecoderLayer


class LlamaForCausalLM(nn.Module):
    """The whole model: embeddings, decoder layers, final norm, LM head (tied or not).

    `spec` defaults to plain Llama's; `models.build_model` passes each family's own
    (`models/__init__.py`), so build through it unless the config is Llama's.
    """

    def __init__(
        self, config: PretrainedConfig, max_positions: int, spec: DecoderSpec | None = None
    ) -> None:
        super().__init__()
        spec = LLAMA if spec is None else spec
        self.config, self.spec = config, spec
        # `_weight` skips the random init: every weight is loaded, and the model is built on the
        # meta device, where the first `normal_` costs ~1.5 s of torch's lazy set-up per process.
        table = torch.empty(config.vocab_size, config.hidden_size)
        # The dense table, or its file's codes where nothing else reads it (`weights.embedding`)
        self.embed_tokens: nn.Embedding | FileEmbedding = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=table
        )
        self.layers = nn.ModuleList(
            self.make_layer(config, i, spec) for i in range(config.num_hidden_layers)
        )
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (
            None if self.tied else Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rope = RotaryEmbedding(config, head_dim_of(config), max_positions)
        self.embedding_multiplier = float(config.embedding_multiplier) if spec.multipliers else 1.0
        self.logits_scaling = float(config.logits_scaling) if spec.multipliers else 1.0
        # A packed 8-bit copy of the LM head, for the passes that run int kernels (the runner).
        self.head_packed: PackedWeight | None = None
        # A tied head's table in oneDNN's layout, for the dense passes (`prepack_dense`).
        self.head_prepacked: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the dense weights' (the final norm's, which every model
        keeps dense; the token table may be codes, `weights.embedding`)."""
        return self.norm.dtype

    def make_layer(self, config: PretrainedConfig, layer_id: int, spec: DecoderSpec) -> nn.Module:
        """Decoder block `layer_id`; a family with a block of its own overrides this."""
        return layer_class(spec)(config, layer_id, spec)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, pool: KVPool
    ) -> torch.Tensor:
        """input_ids: (T,) → final hidden states (T, hidden); each token's K/V goes to the pool."""
        x = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        for layer in self.layers:
            x = layer.forward(x, meta, pool)
        return F.rms_norm(x, x.shape[-1:], self.norm, self.config.rms_norm_eps)

    def prepack_dense(self) -> int:
        """Moves every dense linear weight, and a tied head's copy of the embedding table, into
        oneDNN's layout where that runs here (`weights.onednn`); returns how many moved. Called
        once the load is done with the plain weights."""
        moved = sum(m.prepack_dense() for m in self.modules() if isinstance(m, Linear))
        if self.lm_head is None and isinstance(self.embed_tokens, nn.Embedding):
            # the table itself stays plain: the embedding reads its rows
            self.head_prepacked = onednn.prepack(self.embed_tokens.weight)
            moved += self.head_prepacked is not None
        return moved

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, use_int: bool = False) -> torch.Tensor:
        """hidden: (N, hidden) → float32 logits (N, vocab); `head_packed` for int passes."""
        packed = self.head_packed
        head = self.lm_head  # None exactly when tied
        if packed is not None and use_int:
            logits = packed.matmul(hidden.to(packed.input_dtype)).float()
        elif head is not None:
            logits = head.run(hidden, use_int=False).float()
        elif self.head_prepacked is not None:
            logits = onednn.linear(hidden, self.head_prepacked).float()
        else:
            assert isinstance(self.embed_tokens, nn.Embedding), "a codes table runs packed heads"
            logits = dense_linear(hidden, self.embed_tokens.weight).float()
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    def weight_plan(self, names: set[str]) -> dict[str, WeightSource]:
        """Where each of our parameters may come from in a checkpoint holding `names`.

        It names every tensor a family can have (biases, q/k norms); `load_checked` reads only
        those our parameters, sized from the config, call for.
        """
        plan: dict[str, WeightSource] = {}
        for i, block in enumerate(self.layers):
            # NOTE: Llama's blocks; a family with its own (Gemma) loads its own way.
            layer = cast(DecoderLayer, block)
            p, ours = f"model.layers.{i}.", f"layers.{i}."
            inter = layer.mlp.intermediate
            qkv: tuple[str, ...]
            gate_up: tuple[str, ...]
            qkv_rows: tuple[int, ...]
            gate_up_rows: tuple[int, ...]
            if self.spec.fused_checkpoint:
                qkv, qkv_rows = (p + "self_attn.qkv_proj",), ()
                gate_up, gate_up_rows = (p + "mlp.gate_up_proj",), ()
            else:
                qkv = tuple(p + f"self_attn.{n}_proj" for n in "qkv")
                qkv_rows = layer.self_attn.split_sizes
                gate_up, gate_up_rows = (p + "mlp.gate_proj", p + "mlp.up_proj"), (inter, inter)
            parts = {
                "self_attn.qkv_proj": (qkv, qkv_rows),
                "self_attn.o_proj": ((p + "self_attn.o_proj",), ()),
                "mlp.gate_up_proj": (gate_up, gate_up_rows),
                "mlp.down_proj": ((p + "mlp.down_proj",), ()),
            }
            for module, (hf, rows) in parts.items():
                for kind in ("weight", "bias"):
                    plan[f"{ours}{module}.{kind}"] = WeightSource(
                        tuple(f"{n}.{kind}" for n in hf), rows
                    )
            for norm in (*layer.norm_names, "self_attn.q_norm", "self_attn.k_norm"):
                plan[ours + norm] = WeightSource((f"{p}{norm}.weight",))
        embed = "model.embed_tokens.weight"
        plan["embed_tokens.weight"] = WeightSource((embed,))
        plan["norm"] = WeightSource(("model.norm.weight",))
        head = "lm_head.weight" if "lm_head.weight" in names else embed  # untied, but saved once
        plan["lm_head.weight"] = WeightSource((head,))
        return plan

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads weights named as in transformers, fusing q/k/v and gate/up as it goes.

        A checkpoint that does not fit the config is a ModelLoadError naming the tensor.
        """
        skipped = ("lm_head.weight",) if self.tied else ()
        load_checked(self, state, self.weight_plan(set(state)), skipped)

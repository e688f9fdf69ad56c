"""A model's transformers config from a GGUF file's metadata (llama.cpp's keys).

Two cases. For Gemma 1, Granite and OLMo 2 transformers' GGUF support reads no config at all,
so `own_config` builds it here from the keys llama.cpp's `convert_hf_to_gguf.py` writes for
the family and the defaults llama.cpp's runtime assumes where a key is absent. For the families
transformers does read (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3), `transformers_config`
applies transformers' own key mapping to the parsed header (its loader would first decode the
whole vocabulary with gguf's reader), and `complete_config` sets what that mapping leaves at
the config class's defaults. A file that needs a feature our decoder of
that family lacks is refused here, naming the key and what to do, before any tensor is read.
This module reads metadata only (the parsed header, `gguf_header`, and Phi-3's RoPE factor
tensors); it knows nothing about the loader's cache or the model's modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from sgl_lite.backend.runner.weights.gguf_header import GGUFHeader
from sgl_lite.backend.runner.weights.gguf_tensors import read_tensor

# `general.architecture` → the `model_type` of the config we build ourselves for it
OWN_CONFIG = {"gemma": "gemma", "granite": "granite", "olmo2": "olmo2"}
# Gemma 2/3 files of the 27B shape (by layer count, as llama.cpp tells them apart) scale
# attention by hidden / heads; every other size by the head size.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# The families whose config transformers' GGUF loader reads (Mistral files say "llama")
TRANSFORMERS_READ = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
# tokenizer.ggml.* ids that transformers' own GGUF config mapping copies into the config
_TOKEN_IDS = {
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "padding_token_id",
}


class GGUFConfigError(ValueError):
    """A GGUF file whose metadata lacks a key the config needs, or asks for a feature our
    decoder of its family does not have."""


def own_config(header: GGUFHeader) -> PretrainedConfig:
    """The config of a Gemma 1, Granite or OLMo 2 file (`OWN_CONFIG`), from its metadata.

    Shared keys as llama.cpp names them (`{arch}.embedding_length`, `.block_count`,
    `.attention.head_count`, ...); the vocabulary size from `{arch}.vocab_size` or the embedding
    tensor's rows (OLMo 2 and Gemma files write no vocab_size); tied embeddings when the file
    has no `output.weight`; q/k/v and MLP biases when the file has them.
    """
    arch, meta = header.architecture, header.metadata
    if arch not in OWN_CONFIG:
        raise GGUFConfigError(f"no config of our own for GGUF architecture {arch!r}")
    tensors = {t.name: t for t in header.tensors}
    embedding = tensors.get("token_embd.weight")
    if embedding is None or len(embedding.dims) != 2:
        raise GGUFConfigError("the file has no 2-D token_embd.weight tensor")
    hidden = _int(meta, f"{arch}.embedding_length")
    heads = _int(meta, f"{arch}.attention.head_count")
    if hidden % heads and f"{arch}.attention.key_length" not in meta:
        raise GGUFConfigError(
            f"{arch}.embedding_length ({hidden}) is not a multiple of "
            f"{arch}.attention.head_count ({heads}) and no key_length is given"
        )
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    fields: dict[str, Any] = dict(
        vocab_size=int(meta.get(f"{arch}.vocab_size") or embedding.dims[1]),
        hidden_size=hidden,
        intermediate_size=_int(meta, f"{arch}.feed_forward_length"),
        num_hidden_layers=_int(meta, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        max_position_embeddings=_int(meta, f"{arch}.context_length"),
        rms_norm_eps=float(_key(meta, f"{arch}.attention.layer_norm_rms_epsilon")),
        # llama.cpp's RoPE base when the file names none (Gemma's converter writes none)
        rope_parameters=_rope(header, head_dim),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
    )
    for field, key in _TOKEN_IDS.items():
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None:
            fields[field] = int(value)
    if arch == "gemma":
        fields["head_dim"] = head_dim  # always written by its converter (256 in Gemma 2B/7B)
    elif head_dim != hidden // heads:
        # Granite's converter drops any head_dim; OLMo 2's config has none: heads are hidden/H
        raise GGUFConfigError(
            f"{arch}.attention.key_length ({head_dim}) differs from embedding_length / "
            f"head_count ({hidden // heads}); our {arch} decoder sizes heads as hidden / heads"
        )
    if arch == "granite":
        fields.update(_granite_multipliers(meta, head_dim), mlp_bias="blk.0.ffn_up.bias" in tensors)
    if arch == "olmo2" and f"{arch}.attention.sliding_window" in meta:
        raise GGUFConfigError(
            "olmo2.attention.sliding_window is set: this is an OLMo 3 file (llama.cpp writes "
            "OLMo 3 as olmo2), whose sliding-window layers we do not serve"
        )
    return AutoConfig.for_model(OWN_CONFIG[arch], **fields)


def transformers_config(header: GGUFHeader) -> PretrainedConfig | None:
    """The config transformers' GGUF loader (`load_gguf_checkpoint`) builds for a file of a
    `TRANSFORMERS_READ` family, built from the parsed header with transformers' own mapping
    tables and steps: its per-family defaults, tied embeddings when there is no
    `output.weight`, every `{arch}.*` and `general.*` key it maps, Mistral told apart by its
    `general.name`, Gemma 3 as its text model, the vocabulary's length when the file gives no
    vocab_size. The loader itself decodes the vocabulary and merges token by token with gguf's
    reader before it reads one key: 3-5 s of a first load for a 49k-token vocabulary, and
    more for a 150k one. None for any other family, where a key it maps is an array (which
    the header does not decode), or where this transformers keeps its tables elsewhere: then
    its loader is used."""
    try:
        from transformers.integrations.ggml import (
            GGUF_CONFIG_DEFAULTS_MAPPING,
            GGUF_CONFIG_MAPPING,
        )
    except ImportError:
        return None
    arch, meta = header.architecture, header.metadata
    renames: dict[str, Any] = GGUF_CONFIG_MAPPING  # {prefix: {key: config field}}
    if arch not in TRANSFORMERS_READ or arch not in renames:
        return None
    if any(key.removeprefix(f"{arch}.") in renames[arch] for key in header.array_lengths):
        return None  # a key it maps holds a list (per-layer heads): its loader keeps the values
    # NOTE: transformers compares the name as a one-item list: only the exact name matches
    named = "mistral" if arch == "llama" and meta.get("general.name") == "mistral" else arch
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(named) or GGUF_CONFIG_DEFAULTS_MAPPING.get(arch)
    fields: dict[str, Any] = {"tie_word_embeddings": header.tensor("output.weight") is None}
    for key, value in (defaults or {}).items():
        fields.setdefault(key, value)
    for key, value in meta.items():
        prefix, _, rest = key.replace(arch, named).partition(".")
        renamed = renames.get(prefix, {}).get(rest)
        if renamed is None or renamed == -1:
            continue
        fields[renamed] = value.replace(arch, named) if isinstance(value, str) else value
    if fields.get("model_type") == "gemma3":
        fields["model_type"] = "gemma3_text"  # the file holds the text backbone alone
    tokens = header.array_lengths.get("tokenizer.ggml.tokens")
    if "vocab_size" not in fields and tokens is not None:
        fields["vocab_size"] = tokens
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[fields["model_type"]].from_dict(fields)  # as AutoConfig does


def _granite_multipliers(meta: dict[str, Any], head_dim: int) -> dict[str, float]:
    """Granite's four multipliers from the keys its converter writes (`attention.scale`,
    `embedding_scale`, `residual_scale`, `logit_scale`); an absent or zero key means what
    llama.cpp's runtime does then: 1 / sqrt(head size) for attention, no scaling otherwise."""
    return dict(
        attention_multiplier=float(meta.get("granite.attention.scale") or head_dim**-0.5),
        embedding_multiplier=float(meta.get("granite.embedding_scale") or 1.0),
        residual_multiplier=float(meta.get("granite.residual_scale") or 1.0),
        logits_scaling=float(meta.get("granite.logit_scale") or 1.0),
    )


def _rope(header: GGUFHeader, head_dim: int) -> dict[str, Any]:
    """`rope_parameters` from the file: the base, and linear scaling where it says so. Partial
    rotary, Llama 3's factors (`rope_freqs`) and other scaling types are refused: no decoder of
    these three families takes them from a GGUF."""
    arch, meta = header.architecture, header.metadata
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
    }
    rotary = meta.get(f"{arch}.rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise GGUFConfigError(
            f"{arch}.rope.dimension_count ({rotary}) differs from the head size ({head_dim}): "
            f"partial rotary is not supported for {arch} GGUF files"
        )
    if header.tensor("rope_freqs.weight") is not None:
        raise GGUFConfigError(
            f"the file carries rope_freqs (Llama 3 RoPE factors), which no {arch} model has; "
            "load the model's Hugging Face folder instead"
        )
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor:
        rope.update(rope_type="linear", factor=float(factor))
    elif kind not in (None, "none", "linear"):
        raise GGUFConfigError(
            f"{arch}.rope.scaling.type {kind!r} is not supported for {arch} GGUF files "
            "(none and linear are); load the model's Hugging Face folder instead"
        )
    return rope


def _key(meta: dict[str, Any], key: str) -> Any:
    value = meta.get(key)
    if value is None:
        raise GGUFConfigError(f"the file's metadata has no {key!r}, which the config needs")
    return value


def _int(meta: dict[str, Any], key: str) -> int:
    value = _key(meta, key)
    if not isinstance(value, int) or value <= 0:
        raise GGUFConfigError(f"metadata {key!r} must be a positive integer, got {value!r}")
    return value


def complete_config(config: PretrainedConfig, header: GGUFHeader, path: Path) -> None:
    """What llama.cpp's file says (or its runtime assumes) about a family that transformers'
    GGUF config mapping leaves at the config class's defaults; `config` is changed in place.

    Every family: the head size where the file's `attention.key_length` differs from the
    config's (Qwen3: transformers maps none and the class's default, 128, is taken). Gemma 2:
    its soft-capping values. Gemma 3: its global layers' linear RoPE scaling (4B and up; the
    sliding layers' base is llama.cpp's and transformers' fixed 10000). Gemma 2/3: the
    attention scale, which no key holds: llama.cpp uses the head size, or hidden / heads for
    the 27B models (as their HF configs' `query_pre_attn_scalar` say). Phi-3: the rotated part
    of each head (`rope.dimension_count`, Phi-4-mini's 3/4), the sliding window (0: none) and
    longrope, whose factors llama.cpp keeps as the tensors `rope_factors_long` /
    `rope_factors_short` (its attention factor is the one transformers computes from the two
    lengths, as llama.cpp's converter computes it).
    """
    arch, meta = header.architecture, header.metadata
    key_length = meta.get(f"{arch}.attention.key_length")
    if key_length and getattr(config, "head_dim", None) != key_length:
        config.head_dim = int(key_length)
    if arch == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = meta.get(f"{arch}.{key}")
            if value is not None:
                setattr(config, key, float(value))
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if arch == "gemma3" and meta.get(f"{arch}.rope.scaling.type") == "linear" and factor:
        config.rope_parameters["full_attention"].update(rope_type="linear", factor=float(factor))
    if arch in _GEMMA_27B_LAYERS:
        big = config.num_hidden_layers == _GEMMA_27B_LAYERS[arch]
        scalar = config.hidden_size // config.num_attention_heads if big else config.head_dim
        config.query_pre_attn_scalar = scalar
    if arch == "phi3":
        _complete_phi3(config, meta, path)


def _complete_phi3(config: PretrainedConfig, meta: dict[str, Any], path: Path) -> None:
    rotary = meta.get("phi3.rope.dimension_count")
    head_dim = config.hidden_size // config.num_attention_heads
    if rotary and rotary != head_dim:
        config.rope_parameters["partial_rotary_factor"] = rotary / head_dim
    window = meta.get("phi3.attention.sliding_window")
    if window is not None:
        config.sliding_window = int(window) or None
    long, short = (read_tensor(path, f"rope_factors_{k}.weight") for k in ("long", "short"))
    original = meta.get("phi3.rope.scaling.original_context_length")
    if long is not None and short is not None and original:
        config.original_max_position_embeddings = int(original)
        config.rope_parameters.update(
            rope_type="longrope",
            long_factor=long.tolist(),
            short_factor=short.tolist(),
            original_max_position_embeddings=int(original),
        )

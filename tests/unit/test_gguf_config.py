"""The config we build from a GGUF file's metadata for Gemma 1, Granite and OLMo 2
(`weights/gguf_config.py`): llama.cpp's runtime defaults where its converter writes no key, and
a refusal naming the key for what our decoder of the family does not run. Headers are built in
memory; no file is read."""

from __future__ import annotations

import pytest

from sgl_lite.backend.runner.weights.gguf_config import (
    GGUFConfigError,
    own_config,
    transformers_config,
)
from sgl_lite.backend.runner.weights.gguf_header import GGUFHeader, TensorInfo

HIDDEN, HEADS, VOCAB = 64, 4, 300


def _header(arch: str, extra: dict | None = None, tensors: tuple[str, ...] = ()) -> GGUFHeader:
    """A header with the keys every converter writes, `extra` on top (None values dropped)."""
    metadata = {
        "general.architecture": arch,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.block_count": 2,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **(extra or {}),
    }
    metadata = {k: v for k, v in metadata.items() if v is not None}
    infos = [TensorInfo("token_embd.weight", (HIDDEN, VOCAB), 0, 0)]
    infos += [TensorInfo(name, (HIDDEN,), 0, 0) for name in tensors]
    return GGUFHeader(metadata, tuple(infos), 0, "")


def test_granite_without_multiplier_keys_gets_llama_cpps_defaults():
    """llama.cpp scales attention by 1/sqrt(head size) and skips the other multipliers when
    their keys are absent (or 0); the config says the same."""
    config = own_config(_header("granite", {"granite.attention.scale": 0.0}))
    assert config.model_type == "granite"
    assert config.attention_multiplier == pytest.approx((HIDDEN // HEADS) ** -0.5)
    assert (config.embedding_multiplier, config.residual_multiplier) == (1.0, 1.0)
    assert config.logits_scaling == 1.0
    assert config.vocab_size == VOCAB  # no vocab_size key: the embedding's rows
    assert config.tie_word_embeddings  # no output.weight
    assert not config.attention_bias and not config.mlp_bias


def test_biases_and_an_untied_head_follow_the_files_tensors():
    names = ("blk.0.attn_q.bias", "blk.0.ffn_up.bias", "output.weight")
    config = own_config(_header("granite", tensors=names))
    assert config.attention_bias and config.mlp_bias
    assert not config.tie_word_embeddings


def test_gemma_without_a_rope_base_gets_10000_and_its_head_size():
    config = own_config(_header("gemma", {"gemma.attention.key_length": 256}))
    assert config.model_type == "gemma"
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert config.head_dim == 256
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)


def test_linear_rope_scaling_is_read():
    extra = {"olmo2.rope.scaling.type": "linear", "olmo2.rope.scaling.factor": 4.0}
    config = own_config(_header("olmo2", extra))
    assert config.rope_parameters["rope_type"] == "linear"
    assert config.rope_parameters["factor"] == 4.0


@pytest.mark.parametrize(
    ("arch", "extra", "tensors", "names"),
    [
        ("olmo2", {"olmo2.attention.sliding_window": 4096}, (), "OLMo 3"),
        ("granite", {"granite.rope.scaling.type": "yarn"}, (), "rope.scaling.type 'yarn'"),
        ("granite", {"granite.rope.dimension_count": 8}, (), "partial rotary"),
        ("granite", {}, ("rope_freqs.weight",), "rope_freqs"),
        ("granite", {"granite.attention.key_length": 32}, (), "key_length"),
        ("olmo2", {"olmo2.block_count": None}, (), "'olmo2.block_count'"),
        ("gemma", {"gemma.embedding_length": 0}, (), "positive integer"),
    ],
)
def test_what_our_decoder_does_not_run_is_refused_naming_the_key(arch, extra, tensors, names):
    with pytest.raises(GGUFConfigError, match=names):
        own_config(_header(arch, extra, tensors))


def test_transformers_mapping_is_applied_to_the_header_unless_a_mapped_key_is_an_array():
    header = _header("qwen3", {"qwen3.rope.freq_base": 1e6, "qwen3.vocab_size": VOCAB})
    config = transformers_config(header)
    assert config is not None and config.model_type == "qwen3"
    assert (config.hidden_size, config.num_key_value_heads, config.vocab_size) == (HIDDEN, 2, VOCAB)
    assert config.tie_word_embeddings  # the header has no output.weight
    per_layer = GGUFHeader(
        header.metadata, header.tensors, 0, "", {"qwen3.attention.head_count_kv": 2}
    )
    assert transformers_config(per_layer) is None  # transformers' own loader reads the list
    assert transformers_config(_header("granite")) is None  # not a family transformers reads

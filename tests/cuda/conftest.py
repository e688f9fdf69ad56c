"""CUDA tier fixtures: models built on the spot (random weights, an in-code tokenizer), so the
tier runs on a bare GPU machine where neither the hub nor the embedded GGUF can be reached."""

from __future__ import annotations

import pytest
import torch

SPECIALS = ["<unk>", "<eos>"]


def _save_model(folder, config) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), config.vocab_size)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A 2-layer GQA Llama with random weights and a word-level tokenizer."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("tiny_llama")
    _save_model(folder, config)
    return folder


@pytest.fixture(scope="session")
def smollm_shaped_folder(tmp_path_factory):
    """SmolLM2-135M's exact shapes with random weights: representative decode speed."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("smollm_shaped")
    _save_model(folder, config)
    return folder

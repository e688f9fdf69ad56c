"""A GGUF written with SmolLM2's real tokenizer: its 49k-token byte-level vocabulary and chat
template survive the file's metadata (the other GGUF files: tests/model/test_gguf_models.py)."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path
from tests.support.gguf_files import greedy_ids, save_folder, tiny_model, write_gguf

# Conversions go to each test's own folder (tests/conftest.py), never the user's cache.
pytestmark = pytest.mark.usefixtures("private_cache")


def test_gguf_with_smollm2s_real_tokenizer_round_trips_it(tmp_path, smollm_tokenizer):
    """A 49k-token byte-level vocabulary and SmolLM2's own chat template survive the GGUF
    metadata, and the engine's greedy output equals the safetensors folder's."""
    model = tiny_model(LlamaConfig, smollm_tokenizer, tie_word_embeddings=True)
    gguf_file = tmp_path / "smol-tok.gguf"
    state = write_gguf(gguf_file, model, smollm_tokenizer)
    folder = save_folder(tmp_path / "st", model, state, smollm_tokenizer)
    loaded = load_tokenizer(resolve_model_path(gguf_file))
    assert loaded.chat_template == smollm_tokenizer.chat_template
    text = "<|im_start|>user\nWhat's 2+2? Café, naïve — 東京\n  spaced<|im_end|>\n"
    assert loaded.encode(text) == smollm_tokenizer.encode(text)
    assert greedy_ids(gguf_file, smollm_tokenizer, False) == greedy_ids(
        folder, smollm_tokenizer, False
    )

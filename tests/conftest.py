"""Shared fixtures and the test tiers.

Tiers are markers assigned by directory: tests/unit -> `unit` (no model files: tiny vocabularies
and tokenizers built in the test, such as `tiny_tokenizer`), tests/model -> `model` (tiny random
configs), tests/e2e -> `e2e` (the embedded SmolLM2), tests/cuda -> `cuda` (skipped without a
CUDA device). A test anywhere that asks for a SmolLM2 fixture (`SMOLLM_FIXTURES`) is `e2e`
instead of its directory's tier, so `make test-fast` (`-m "unit or model"`) never loads SmolLM2
through a fixture.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

NUM_THREADS = int(os.environ.get("SGL_LITE_NUM_THREADS", "2"))
torch.set_num_threads(NUM_THREADS)

TIERS = {"unit": "unit", "model": "model", "e2e": "e2e", "cuda": "cuda"}
SMOLLM_FIXTURES = frozenset({"smollm_folder", "smollm_tokenizer", "hf_smollm", "engine"})
_TESTS = Path(__file__).parent


def pytest_report_header(config: pytest.Config) -> str:
    return f"sgl_lite tests: torch {torch.__version__}, {torch.get_num_threads()} threads"


def tier_of(item: pytest.Item) -> str | None:
    """The tier of a collected test: its directory's, or `e2e` if it uses SmolLM2."""
    try:
        top = Path(item.path).resolve().relative_to(_TESTS.resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    tier = TIERS.get(top)
    if tier in ("unit", "model") and SMOLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "e2e"
    return tier


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        tier = tier_of(item)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "cuda" and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


# --- the embedded SmolLM2 (e2e) ----------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm_folder():
    """The converted embedded model (converted once into the cache dir)."""
    from sgl_lite.backend.runner.model_loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_folder):
    """SmolLM2's tokenizer."""
    from sgl_lite.backend.runner.model_loader import load_tokenizer

    return load_tokenizer(smollm_folder)


@pytest.fixture(scope="session")
def engine():
    """One shared engine on the embedded model; tests must leave it idle and consistent."""
    from sgl_lite.backend.engine import Engine

    eng = Engine(num_threads=NUM_THREADS, max_total_tokens=16384)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def hf_smollm(smollm_folder):
    """transformers' own implementation of the same weights, for reference outputs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm_folder, dtype=torch.float32).eval()


def chat_prompt(tokenizer, *turns: str) -> str:
    """A chat-template prompt from alternating user/assistant turns, ending at the assistant."""
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# --- a tiny tokenizer built in the test (unit) -------------------------------------------------
TINY_SYSTEM_PROMPT = "You are a tiny test assistant."
# SmolLM2's template shape (ChatML with a default system message), with our own system prompt.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + TINY_SYSTEM_PROMPT + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_CORPUS = (
    "The capital of France is Paris.",
    "Paris is a city in France.",
    "What is the capital of France?",
    "Q: Best pet?\nA: cat",
    "A dog, a cat and a hamster.",
    "Pick: red or blue",
    "Say: hello",
    TINY_SYSTEM_PROMPT,
)


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (~340 tokens) trained here on a few sentences, wrapped as a
    transformers tokenizer with a ChatML chat template: any text encodes (bytes), frequent
    words such as " Paris" are one token, and nothing is read from disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(_TINY_CORPUS) * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """`build_tiny_tokenizer()`, built once per session."""
    return build_tiny_tokenizer()


# A tiny random Llama whose vocabulary holds the tiny tokenizer's ids.
TINY_LLAMA = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


@pytest.fixture
def tiny_llama_folder(tmp_path, tiny_tokenizer):
    """A loadable model folder: TINY_LLAMA's config, random weights (seed 0), the tiny tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    return tmp_path

"""Shared fixtures: thread count, the embedded SmolLM2 engine (one per session), its tokenizer."""

from __future__ import annotations

import os

import pytest
import torch

NUM_THREADS = int(os.environ.get("SGL_LITE_NUM_THREADS", "2"))
torch.set_num_threads(NUM_THREADS)


def pytest_report_header(config):
    return f"sgl_lite tests: torch {torch.__version__}, {torch.get_num_threads()} threads"


@pytest.fixture(scope="session")
def smollm_folder():
    """The converted embedded model (converted once into the cache dir)."""
    from sgl_lite.backend.model_loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_folder):
    """SmolLM2's tokenizer."""
    from sgl_lite.backend.model_loader import load_tokenizer

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

"""SmolLM2's tokenizer outside a fixture (for module-level parametrization and the model-free
decode loops, which need it at import time or in plain functions), and chat prompts.

Tests that take it need the embedded SmolLM2's files but run no forward pass: the `tokenizer`
tier, tests/tokenizer/ (a lighter folder's module that imports it is refused, tiers.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.cache
def smollm2_tokenizer() -> Any:
    """The embedded SmolLM2 tokenizer (byte-level BPE, 49152 ids, eos 2), loaded once."""
    torch.set_num_threads(1)
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(None))


def chat_prompt(tokenizer: Any, *turns: str) -> str:
    """A chat-template prompt from alternating user/assistant turns, ending at the assistant."""
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

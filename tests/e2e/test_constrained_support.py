"""Shared helpers for the constrained-decoding tests (no tests here).

They live in a module, not a conftest.py, so that the tokenizer and compiled grammars are
built once per session and shared by every test_constrained_* file.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from sgl_lite.backend.constrained import (
    CompiledGrammar,
    GrammarCompiler,
    Guide,
    apply_jump_forward,
    plan_jump_forward,
)

MAX_STEPS = 400


@functools.cache
def smollm2_tokenizer() -> Any:
    """The embedded SmolLM2 tokenizer (byte-level BPE, 49152 ids, eos 2), loaded once."""
    torch.set_num_threads(1)
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(None))


@functools.cache
def shared_compiler() -> GrammarCompiler:
    """One compiler (and so one grammar cache) for the whole session."""
    return GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0)


@functools.cache
def _closing_bias() -> torch.Tensor:
    vocab = shared_compiler().vocab
    bias = torch.zeros(vocab.size)
    for i, b in enumerate(vocab.token_bytes):
        if b is not None and any(c in b for c in b'"]},'):
            bias[i] = 3.0  # NOTE: random logits would otherwise wander in free strings for ages
    bias[vocab.eos_token_id] = 3.0
    return bias


class Decoded(NamedTuple):
    text: str
    ids: list[int]
    sampling_steps: int


def decode_without_model(
    grammar: CompiledGrammar,
    *,
    seed: int,
    jump_forward: bool,
    max_new_tokens: int | None = None,
    bias: bool = True,
) -> Decoded:
    """A model-free decode loop: seeded random logits, masked by the guide, argmax-sampled.

    With `max_new_tokens` the guide is budgeted; `bias=False` drops the closing bias (random
    logits then wander in free strings until the budget closes them).
    """
    tokenizer = smollm2_tokenizer()
    bias_row = _closing_bias() if bias else torch.zeros(grammar.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    guide = Guide(grammar, max_new_tokens=max_new_tokens)
    out: list[int] = []
    steps = 0
    while not guide.is_finished():
        assert steps < MAX_STEPS, f"no end after {MAX_STEPS} steps: {out}"
        logits = torch.randn(grammar.vocab_size, generator=gen) + bias_row  # (V,)
        logits.masked_fill_(~guide.allowed_mask(), float("-inf"))
        token_id = int(logits.argmax())
        steps += 1
        if token_id == grammar.eos_token_id:
            assert guide.is_accepting()
            break
        guide.advance(token_id)
        out.append(token_id)
        if jump_forward:
            jf = plan_jump_forward(tokenizer, guide, out)
            if jf is not None and apply_jump_forward(guide, jf):
                out[jf.keep :] = jf.new_ids
        assert guide.num_advanced == len(out)
    assert guide.is_accepting()
    raw = grammar.vocab.decode_bytes(out)
    assert raw is not None, "a special or unknown token was generated"
    return Decoded(raw.decode("utf-8"), out, steps)

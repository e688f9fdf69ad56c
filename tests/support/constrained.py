"""Model-free decode loops on SmolLM2's tokenizer for the constrained-decoding tests: seeded
random logits masked by a guide, argmax-sampled, on the automaton or a grammar backend.

The tokenizer and compilers are cached per session (`functools.cache`), so every module that
uses them shares one grammar cache; the modules are `tokenizer` tier (no forward pass).
"""

from __future__ import annotations

import functools
import json
import re
from typing import NamedTuple

import jsonschema
import torch

from sgl_lite.backend.constrained import (
    AutomatonGuide,
    CompiledGrammar,
    GrammarCompiler,
    apply_jump_forward,
    plan_jump_forward,
)
from tests.support.smollm import smollm2_tokenizer

MAX_STEPS = 400
GRAMMAR_BACKENDS = ("llguidance", "xgrammar")


@functools.cache
def shared_compiler() -> GrammarCompiler:
    """One compiler (and so one grammar cache) for the whole session."""
    return GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0)


@functools.cache
def closing_bias() -> torch.Tensor:
    """A logit bias (V,) towards closing characters and eos, so random decodes end."""
    vocab = shared_compiler().vocab
    bias = torch.zeros(vocab.size)
    for i, b in enumerate(vocab.token_bytes):
        if b is not None and any(c in b for c in b'"]},'):
            bias[i] = 3.0  # NOTE: random logits would otherwise wander in free strings for ages
    bias[vocab.eos_token_id] = 3.0
    return bias


class Decoded(NamedTuple):
    """A model-free decode: its text, token ids, and how many steps sampled (not forced)."""

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
    bias_row = closing_bias() if bias else torch.zeros(grammar.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    guide = AutomatonGuide(grammar, max_new_tokens=max_new_tokens)
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
            splice_jump_forward(tokenizer, guide, out)
        assert guide.num_advanced == len(out)
    assert guide.is_accepting()
    raw = grammar.vocab.decode_bytes(out)
    assert raw is not None, "a special or unknown token was generated"
    return Decoded(raw.decode("utf-8"), out, steps)


@functools.cache
def grammar_bias() -> torch.Tensor:
    """Closing characters (and '@', which ends llguidance's long email local parts) first."""
    at = torch.tensor([b is not None and b"@" in b for b in llg_vocab_bytes()])
    return closing_bias() + 3.0 * at


def llg_vocab_bytes() -> tuple:
    """Each SmolLM2 token's bytes (None for specials), as the grammar backends see them."""
    from sgl_lite.backend.constrained.vocab import vocabulary_for

    return vocabulary_for(smollm2_tokenizer()).token_bytes


class ArithmeticParser:
    """A reference recursive-descent parser for the arithmetic grammar."""

    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def parse(self) -> None:
        self.expr()
        assert self.i == len(self.text), f"trailing text at {self.i}: {self.text!r}"

    def expr(self) -> None:
        self.term()
        while self.peek() in ("+", "-"):
            self.i += 1
            self.term()

    def term(self) -> None:
        self.factor()
        while self.peek() in ("*", "/"):
            self.i += 1
            self.factor()

    def factor(self) -> None:
        if self.peek() == "(":
            self.i += 1
            self.expr()
            assert self.peek() == ")", self.text
            self.i += 1
            return
        m = re.compile(r"[0-9]{1,3}").match(self.text, self.i)
        assert m, f"expected a number at {self.i}: {self.text!r}"
        self.i = m.end()

    def peek(self) -> str:
        return self.text[self.i : self.i + 1]


@functools.cache
def compiler(backend: str) -> GrammarCompiler:
    """One compiler per grammar backend ("llguidance", "xgrammar") for the session."""
    return GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0, backend=backend)


def backend_decode(grammar, *, seed: int, constraint=None, max_steps: int = 400, budget=None):
    """Random logits (closing characters favoured) masked by the guide, argmax, with the
    backend's own jump-forward; returns (text, guide) so the caller can read its meta_info."""
    tokenizer = smollm2_tokenizer()
    gen = torch.Generator().manual_seed(seed)
    guide = grammar.new_guide(max_new_tokens=budget, constraint=constraint)
    out: list[int] = []
    for _ in range(max_steps):
        if guide.is_finished() or (budget is not None and guide.tokens_left <= 0):
            break
        logits = torch.randn(len(tokenizer), generator=gen) + grammar_bias()  # (V,)
        logits.masked_fill_(~guide.allowed_mask(), float("-inf"))
        token = int(logits.argmax())
        if token == tokenizer.eos_token_id:
            assert guide.is_accepting()
            break
        guide.advance(token)
        out.append(token)
        splice_jump_forward(tokenizer, guide, out)
    return tokenizer.decode(out), guide


def splice_jump_forward(tokenizer, guide, out: list[int]) -> int:
    """The engine's jump-forward on a model-free decode: plan, apply and splice as
    `OutputProcessor` does (`constrained.jump_forward`); returns the tokens it added."""
    plan = plan_jump_forward(tokenizer, guide, out)
    if plan is None or not apply_jump_forward(guide, plan):
        return 0
    before = len(out)
    out[plan.keep :] = plan.new_ids
    return len(out) - before


def valid_json(schema: dict, text: str) -> bool:
    """Whether `text` parses as JSON that validates against `schema`, formats included."""
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))
    except (ValueError, jsonschema.ValidationError):
        return False
    return True

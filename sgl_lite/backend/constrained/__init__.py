"""Constrained decoding: regex / JSON Schema / dtype → cached automaton → per-request Guide.

Lifetimes: a vocabulary per tokenizer (vocab.py), a compiled grammar per pattern shared by all
requests (compiler.py), a Guide per request (guide.py), plus jump-forward over forced text
(jump_forward.py). Nothing here knows about the scheduler, the KV pool or the model.
"""

from sgl_lite.backend.constrained.compiler import CompiledGrammar, GrammarCompiler, GrammarError
from sgl_lite.backend.constrained.dtypes import dtype_to_regex
from sgl_lite.backend.constrained.guide import Guide
from sgl_lite.backend.constrained.jump_forward import (
    JumpForward,
    apply_jump_forward,
    forced_bytes,
    plan_jump_forward,
)

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "Guide",
    "JumpForward",
    "apply_jump_forward",
    "dtype_to_regex",
    "forced_bytes",
    "plan_jump_forward",
]

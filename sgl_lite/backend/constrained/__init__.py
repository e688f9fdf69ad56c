"""Constrained decoding: regex / JSON Schema / dtype → cached automaton → per-request Guide.

Lifetimes: a vocabulary per tokenizer (vocab.py), a compiled grammar per pattern shared by all
requests (compiler.py builds grammar.py's CompiledGrammar with budget.py's distance table), a
Guide per request (guide.py: budget-aware mask, final validation by fidelity.py), plus
jump-forward over forced text (jump_forward.py). Nothing here knows about the scheduler, the KV
pool or the model.
"""

from sgl_lite.backend.constrained.compiler import GrammarCompiler
from sgl_lite.backend.constrained.dtypes import dtype_to_regex
from sgl_lite.backend.constrained.fidelity import COUNTERS, check_output
from sgl_lite.backend.constrained.grammar import CompiledGrammar
from sgl_lite.backend.constrained.guide import BudgetError, Guide
from sgl_lite.backend.constrained.jump_forward import (
    JumpForward,
    apply_jump_forward,
    forced_bytes,
    plan_jump_forward,
)
from sgl_lite.backend.constrained.regex_check import GrammarError

__all__ = [
    "COUNTERS",
    "BudgetError",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "Guide",
    "JumpForward",
    "apply_jump_forward",
    "check_output",
    "dtype_to_regex",
    "forced_bytes",
    "plan_jump_forward",
]

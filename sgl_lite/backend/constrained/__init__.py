"""Constrained decoding: from a request's constraint to the token mask of each step.

    gen(json_schema=...) / regex / ebnf ─► SamplingParams.constraint (kind, pattern)
      ─► GrammarCompiler (compiler.py): normalize (schema/) ─► schema → regex for the automaton
         (automaton/), or a matcher (matchers/: llguidance, xgrammar)
      ─► Grammar (protocols.py), cached by (backend, source) ─► Grammar.new_guide(): a Guide
         per request ─► allowed_mask() each step in the sampler / mask prefetch
      ─► advance() and jump-forward (jump_forward.py) in the output processor
      ─► meta_info(): the fidelity check of the finished text (fidelity.py)

A vocabulary is built once per tokenizer (vocab.py). Nothing here knows about the scheduler,
the KV pool or the model.
"""

from sgl_lite.backend.constrained.automaton.grammar import CompiledGrammar
from sgl_lite.backend.constrained.automaton.guide import AutomatonGuide
from sgl_lite.backend.constrained.compiler import GrammarCompiler
from sgl_lite.backend.constrained.fidelity import COUNTERS, check_output
from sgl_lite.backend.constrained.jump_forward import apply_jump_forward, plan_jump_forward
from sgl_lite.backend.constrained.protocols import Constraint, Grammar, Guide, JumpForward
from sgl_lite.backend.constrained.regex_check import BudgetError, GrammarError
from sgl_lite.backend.constrained.schema.schema_normalize import is_any_object

__all__ = [
    "COUNTERS",
    "AutomatonGuide",
    "BudgetError",
    "CompiledGrammar",
    "Constraint",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "Guide",
    "JumpForward",
    "apply_jump_forward",
    "check_output",
    "is_any_object",
    "plan_jump_forward",
]

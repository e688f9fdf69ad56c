"""W3B and W3T: W3's JSON extraction on every grammar backend, with and without budget
awareness (W3B), and at a tight budget of 1.2x the shortest valid output (W3T).

Each row is W3 as `SglLite.w3` measures it (wall, valid fraction, constrained/unconstrained
per-token time, jump-forward passes saved) on a pair of engines (jump-forward on and off) built
with that `grammar_backend`; W3T reuses W3B's pairs (EnginePairs). "no budget" switches the
automaton's budget rule off (`GrammarCompiler.budget_aware`), as every other runtime decodes; the
grammar backends' closer (closer.py) has no switch. In W3T the peers (outlines, llama-cpp-python,
each in its own process where installed) run the same tight budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bench.workloads import Workloads

# (row name, grammar_backend, budget-aware)
# NOTE: "sgl_" names: W3T also has rows for the peers, one of which is outlines itself
ROWS = (
    ("sgl_outlines", "outlines", True),
    ("sgl_outlines_no_budget", "outlines", False),
    ("sgl_llguidance", "llguidance", True),
    ("sgl_xgrammar", "xgrammar", True),
)
TIGHT_FACTOR = 1.2
MAX_TOTAL_TOKENS = 4096


def shortest_valid_tokens(tokenizer: Any, schema: dict) -> int:
    """Tokens in the shortest output the W3 schema accepts (the automaton's distance table)."""
    from sgl_lite.backend.constrained import GrammarCompiler

    return GrammarCompiler(tokenizer, timeout_s=60.0).compile("json_schema", schema).min_tokens


def tight(wl: Workloads, tokenizer: Any) -> tuple[Workloads, int]:
    """W3 with max_new_tokens at 1.2x the shortest valid output, and that shortest length."""
    shortest = shortest_valid_tokens(tokenizer, wl.json_schema)
    budget = math.ceil(TIGHT_FACTOR * shortest)
    return dataclasses.replace(wl, json_max_new_tokens=budget), shortest


class EnginePairs:
    """The (jump-forward on, off) engine pairs of the rows, built on first use and kept for
    both W3B and W3T: each costs a model load and an int4 packing, and the rows of the two
    workloads ask for the same pairs. `budget_aware` is part of the key because the compiler
    stamps it on the grammars it caches."""

    def __init__(self, num_threads: int) -> None:
        self.num_threads = num_threads
        self._pairs: dict[tuple[str, bool], tuple[Any, Any]] = {}

    def get(self, backend: str, budget_aware: bool) -> tuple[Any, Any]:
        """The pair for one row's grammar backend and budget switch."""
        key = (backend, budget_aware)
        if key not in self._pairs:
            self._pairs[key] = _engines(self.num_threads, backend, budget_aware)
        return self._pairs[key]

    def shutdown(self) -> None:
        """Shuts every engine built so far down."""
        for pair in self._pairs.values():
            for engine in pair:
                engine.shutdown()
        self._pairs.clear()


def _engines(num_threads: int, backend: str, budget_aware: bool) -> tuple[Any, Any]:
    from sgl_lite.backend.engine import Engine

    pair = tuple(
        Engine(
            num_threads=num_threads,
            max_total_tokens=MAX_TOTAL_TOKENS,
            grammar_backend=backend,
            disable_jump_forward=no_jf,
        )
        for no_jf in (False, True)
    )
    for eng in pair:
        eng.builder.compiler.budget_aware = budget_aware
    return pair[0], pair[1]


def run_row(pairs: EnginePairs, backend: str, budget_aware: bool, wl: Workloads, repeats: int):
    """One backend's W3 figures, medians over `repeats`, on that backend's engine pair."""
    from bench.run import measure
    from bench.sgl_engine import SglLite

    jf, no_jf = pairs.get(backend, budget_aware)
    system = SglLite(pairs.num_threads, engine=jf)
    system._no_jf = no_jf  # the jump-forward-off twin, on the same backend
    figs = measure(system, "w3", wl, repeats)
    figs.pop("_run", None)
    figs.update(grammar_backend=backend, budget_aware=budget_aware)
    return figs


def run_backends(pairs: EnginePairs, wl: Workloads, repeats: int, block: dict) -> dict:
    """W3B: every row of ROWS at W3's own max_new_tokens."""
    for name, backend, budget_aware in ROWS:
        print(f"[W3B] {name} ...", flush=True)
        block["systems"][name] = run_row(pairs, backend, budget_aware, wl, repeats)
    block["notes"].append(
        "each row: an engine pair with that grammar_backend (W3T reuses it); "
        "sgl_outlines_no_budget: the automaton with its budget rule off"
    )
    return block


def run_tight(
    pairs: EnginePairs, wl: Workloads, tokenizer: Any, repeats: int, block: dict, peers: dict
) -> dict:
    """W3T: every row of ROWS and the peers at 1.2x the shortest valid output (`peers`: name
    -> a callable building the peer for a given tight max_new_tokens, or why it is missing)."""
    from bench.run import measure

    tight_wl, shortest = tight(wl, tokenizer)
    block["notes"].append(
        f"max_new_tokens = ceil({TIGHT_FACTOR} x {shortest}) = {tight_wl.json_max_new_tokens} "
        "(the shortest valid output, from the automaton's distance table); target: 100 % valid "
        "with the budget on"
    )
    for name, backend, budget_aware in ROWS:
        print(f"[W3T] {name} ...", flush=True)
        block["systems"][name] = run_row(pairs, backend, budget_aware, tight_wl, repeats)
    for name, make in peers.items():
        peer = make if isinstance(make, str) else make(tight_wl.json_max_new_tokens)
        if isinstance(peer, str):
            block["systems"][name] = {"skipped": peer}
            continue
        print(f"[W3T] {name} ...", flush=True)
        try:
            block["systems"][name] = measure(peer, "w3", tight_wl, repeats)
        finally:
            peer.shutdown()
    block["shortest_valid_tokens"] = shortest
    block["max_new_tokens"] = tight_wl.json_max_new_tokens
    return block

"""The per-request cursor over a shared CompiledGrammar: mask, advance, rollback.

A Guide holds only a state id and the history of states it came through; everything heavy
(the index, the per-state masks) lives on the grammar and is shared across requests.
"""

from __future__ import annotations

import torch

from sgl_lite.backend.constrained.compiler import CompiledGrammar, GrammarError


class Guide:
    """Where one request stands in its grammar.

    The engine calls `allowed_mask()` before sampling, `advance(token)` after (never with
    eos), and stops the request when `is_finished()` or when eos is sampled in an accepting
    state.
    """

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        self.state: int = grammar.initial_state
        self._history: list[int] = []  # state before each advance

    def allowed_mask(self) -> torch.Tensor:
        """(V,) bool, True = allowed; cached on the grammar, do not write into it."""
        return self.grammar.mask(self.state)

    def advance(self, token_id: int) -> None:
        """Moves over `token_id`; raises GrammarError if the grammar does not allow it here."""
        nxt = self.grammar.next_state(self.state, token_id)
        if nxt is None:
            what = "eos" if token_id == self.grammar.eos_token_id else f"token {token_id}"
            raise GrammarError(
                f"{what} is not allowed in grammar state {self.state} "
                f"(after {len(self._history)} tokens)"
            )
        self._history.append(self.state)
        self.state = nxt

    def is_accepting(self) -> bool:
        """Whether eos is allowed here (the output so far is a full match)."""
        return self.grammar.is_accepting(self.state)

    def is_finished(self) -> bool:
        """Whether nothing but eos is allowed: stop without another forward pass."""
        return self.grammar.is_finished(self.state)

    def rollback(self, n: int) -> None:
        """Undoes the last `n` advances."""
        if not 0 <= n <= len(self._history):
            raise ValueError(f"rollback needs 0 <= n <= {len(self._history)} advances, got {n}")
        if n:
            self.state = self._history[-n]
            del self._history[-n:]

    def state_at(self, n: int) -> int:
        """The state this guide was in after its first `n` advances."""
        if not 0 <= n <= len(self._history):
            raise ValueError(f"state_at needs 0 <= n <= {len(self._history)}, got {n}")
        return self._history[n] if n < len(self._history) else self.state

    @property
    def num_advanced(self) -> int:
        """How many tokens this guide has advanced over (and not rolled back)."""
        return len(self._history)

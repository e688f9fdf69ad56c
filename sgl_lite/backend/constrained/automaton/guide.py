"""The automaton's per-request cursor over a shared CompiledGrammar: mask, advance, rollback,
jump forward, validate (the `Guide` protocol of protocols.py).

An AutomatonGuide holds a state id, the history of states it came through and the request's
token budget; everything heavy (the index, the per-state masks, the distance table) lives on the
grammar and is shared across requests. The guide counts the tokens it is advanced by (sampled
and jump-forward alike), so the engine only has to pass `max_new_tokens` once. The budget is
kept by the mask alone (a token is allowed only if a full match still fits after it), so
`budget_substitute` never replaces a token here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sgl_lite.backend.constrained.fidelity import COUNTERS, check_output
from sgl_lite.backend.constrained.jump_forward import retokenize
from sgl_lite.backend.constrained.protocols import Constraint, JumpForward
from sgl_lite.backend.constrained.regex_check import BudgetError, GrammarError

if TYPE_CHECKING:  # the grammar makes its guides: grammar.py imports this module
    from sgl_lite.backend.constrained.automaton.grammar import CompiledGrammar


class AutomatonGuide:
    """Where one request stands in its automaton.

    The engine calls `allowed_mask()` before sampling, `advance(token)` after (never with
    eos), and stops the request when `is_finished()` or when eos is sampled in an accepting
    state; at the end `meta_info(text)` checks the text and says whether the budget closed it.

    With `max_new_tokens`, the mask allows a token only if an accepting state stays reachable
    within the tokens left, so the output is complete whenever the budget runs out; a budget
    below `grammar.min_tokens` raises BudgetError here. `constraint` is the request's
    (kind, pattern), used only by the final validation.
    """

    def __init__(
        self,
        grammar: CompiledGrammar,
        *,
        max_new_tokens: int | None = None,
        constraint: Constraint | None = None,
    ) -> None:
        if max_new_tokens is not None and grammar.min_tokens > max_new_tokens:
            COUNTERS.add("budget_refused")
            raise BudgetError(
                f"max_new_tokens={max_new_tokens} is too small for this constraint: its shortest "
                f"valid output takes {grammar.min_tokens} tokens; raise max_new_tokens to at "
                f"least {grammar.min_tokens}"
            )
        self.grammar = grammar
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint
        self.state: int = grammar.initial_state
        self.budget_closed = False  # the budget removed a token the grammar alone allowed
        self._history: list[int] = []  # state before each advance
        self._meta: dict[str, Any] | None = None

    @property
    def eos_token_id(self) -> int:
        """The tokenizer's eos token (allowed only in accepting states)."""
        return self.grammar.eos_token_id

    @property
    def tokens_left(self) -> int | None:
        """Budget left (max_new_tokens minus tokens advanced), or None without a budget."""
        if self.max_new_tokens is None:
            return None
        return self.max_new_tokens - len(self._history)

    def allowed_mask(self) -> torch.Tensor:
        """(V,) bool, True = allowed under grammar and budget; cached, do not write into it."""
        left = self.tokens_left
        if left is not None and self.grammar.budget_restricts(self.state, left):
            self.budget_closed = True
        return self.grammar.mask(self.state, left)

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
        """Whether nothing but eos is allowed (by grammar or budget): stop without a forward."""
        if self.grammar.is_finished(self.state):
            return True
        if self.grammar.is_finished(self.state, self.tokens_left):
            self.budget_closed = True
            return True
        return False

    def fits_after(self, keep: int, new_ids: list[int]) -> bool:
        """Whether rolling back to `keep` advances and advancing over `new_ids` is allowed by
        the grammar and leaves an accepting state within the budget (jump-forward's check)."""
        if not 0 <= keep <= len(self._history):
            return False
        s = self.state_at(keep)
        for token_id in new_ids:
            nxt = self.grammar.next_state(s, token_id)
            if nxt is None:
                return False
            s = nxt
        if self.max_new_tokens is None:
            return True
        return self.grammar.fits(s, self.max_new_tokens - keep - len(new_ids))

    def budget_substitute(self, token_id: int) -> int:
        """`token_id` itself: the budget-aware mask already allowed only tokens after which a
        full match fits the tokens left."""
        return token_id

    def plan_jump_forward(self, tokenizer: Any, output_ids: list[int]) -> JumpForward | None:
        """The forced bytes from here, retokenized with the output's tail (jump_forward.py);
        None when nothing is forced or the new tokens do not fit the grammar or the budget."""
        forced = self.grammar.forced_bytes(self.state)
        if not forced:
            return None
        jf = retokenize(tokenizer, self.grammar.vocab.decode_bytes, output_ids, forced)
        # NOTE: checked here, before the engine drops any KV: a retokenized jump the grammar
        # refuses, or one that would leave no valid ending within the budget, is not taken.
        if jf is None or not self.fits_after(jf.keep, jf.new_ids):
            return None
        return jf

    def apply_jump_forward(self, jf: JumpForward) -> bool:
        """Rolls back to `jf.keep` advances and advances over `jf.new_ids`, after checking
        every new token and the budget; False, with the guide untouched, if they do not fit."""
        if not self.fits_after(jf.keep, jf.new_ids):
            return False
        self.rollback(self.num_advanced - jf.keep)
        for token_id in jf.new_ids:
            self.advance(token_id)
        return True

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

    def validate(self, text: str) -> str | None:
        """None when `text` satisfies the request's constraint (or none was given), else why not."""
        if self.constraint is None:
            return None
        kind, pattern = self.constraint
        return check_output(kind, pattern, text)

    def meta_info(self, text: str) -> dict[str, Any]:
        """`budget_closed` and `constraint_violation` (None when valid) for the finished
        request's meta_info; validates and counts once, later calls return the same dict."""
        if self._meta is None:
            violation = self.validate(text)
            self._meta = {"budget_closed": self.budget_closed, "constraint_violation": violation}
            if self.budget_closed:
                COUNTERS.add("budget_closed")
            if violation is not None:
                COUNTERS.add("constraint_violations")
        return dict(self._meta)

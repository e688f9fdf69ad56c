"""What the two grammar-backend cursors (llguidance's LLGuide, xgrammar's XGGuide) share: the
budget rule, the mask memo, and the final validation with its meta flags.

Neither backend can say how many tokens the shortest completion takes, so the budget rests on
closer.py's deterministic closer instead of a distance table: a budget below the closer's
length from the start is refused up front (BudgetError naming the minimum), and a sampled token
after which no known completion fits the tokens left is replaced by the next token of one that
does (`budget_substitute`, `budget_closed`), so the output is complete when the budget runs
out. Where the closer finds no completion within its cap, the guarantee is lost for that
request: an output the budget cut is flagged (`budget_cut`) and reported as a violation, never
passed off as valid. A complete output is still checked against the request's JSON Schema or
regex, which catches what a backend only approximates (xgrammar's `oneOf` as `anyOf`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from sgl_lite.backend.constrained.fidelity import COUNTERS, check_output
from sgl_lite.backend.constrained.matchers.closer import (
    CLOSER_CAP,
    ClosingBudget,
    ClosingMatcher,
    Ranked,
    closing_path,
    ranked_tokens,
)
from sgl_lite.backend.constrained.protocols import Constraint, JumpForward
from sgl_lite.backend.constrained.regex_check import BudgetError, GrammarError


class ClosableGrammar:
    """What the grammar backends' compiled grammars (LLGrammar, XGGrammar) share for the
    closer: its ranked tokens, the per-token text test, and its path from the start state."""

    eos_token_id: int
    text_mask: torch.Tensor
    ranked: Ranked
    is_text: list[bool]  # the closer's per-token test
    initial_path: list[int] | None  # the closer's path from the start; None: it found none

    def _init_closer(self, vocab: Any, start: Callable[[], ClosingMatcher]) -> None:
        """Sets the closer's tables from `vocab` (after `text_mask`), then walks it from the
        matcher `start()` builds: what a budget must at least allow."""
        self.ranked = ranked_tokens(vocab)
        self.is_text = self.text_mask.tolist()
        self.initial_path = closing_path(start(), self.ranked, CLOSER_CAP)

    @property
    def min_tokens(self) -> int:
        """The closer's length from the start state: no budget below it is accepted (0 where
        the closer found no completion, and budgets are then not checked up front)."""
        return 0 if self.initial_path is None else len(self.initial_path)


class BackendGuide(ABC):
    """The Guide protocol over a grammar backend's matcher; subclasses give the matcher ops
    (`_fill_mask`, `_consume`, `_rollback`, `is_accepting`, `_forced`, `_closing_copy`).

    The grammar gives the closer's path from the start state (`initial_path`, None where it
    found none) and its ranked tokens (closer.py); a budget below the path's length raises
    BudgetError.
    """

    def __init__(
        self,
        grammar: ClosableGrammar,
        max_new_tokens: int | None,
        constraint: Constraint | None,
    ) -> None:
        eos_token_id, initial_path = grammar.eos_token_id, grammar.initial_path
        need = None if initial_path is None else len(initial_path)
        if max_new_tokens is not None and need is not None and need > max_new_tokens:
            COUNTERS.add("budget_refused")
            raise BudgetError(
                f"max_new_tokens={max_new_tokens} is too small for this constraint: the shortest "
                f"valid output this backend found takes {need} tokens; raise max_new_tokens to "
                f"at least {need}"
            )
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint
        self.budget_closed = False  # the budget replaced a sampled token by the closer's
        self.closer: ClosingBudget | None = None
        if max_new_tokens is not None:
            self.closer = ClosingBudget(
                self._closing_copy,
                self._completes,
                grammar.ranked,
                eos_token_id,
                initial_path,
            )
            self.closer.guarded = initial_path is not None
        self._advanced = 0
        self._mask: torch.Tensor | None = None  # memo of the mask at `_advanced` tokens
        self._meta: dict[str, Any] | None = None

    # -- the matcher, per backend ----------------------------------------------------------

    @abstractmethod
    def _fill_mask(self) -> torch.Tensor:
        """The allowed-token mask at the current position."""

    @abstractmethod
    def _consume(self, token_id: int) -> str | None:
        """Consumes the token; None when allowed, else the backend's reason."""

    @abstractmethod
    def _rollback(self, n: int) -> None:
        """Undoes the last n consumed tokens."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """Whether the output so far is complete (eos allowed)."""

    @abstractmethod
    def _forced(self) -> list[int]:
        """The text tokens the grammar forces from here, possibly none."""

    @abstractmethod
    def _closing_copy(self) -> ClosingMatcher:
        """A private copy of the matcher at the current state, for the closer to walk."""

    def _completes(self, tokens: list[int]) -> bool:
        """Whether `tokens` from the current state are allowed and end complete (the state
        stays); on a copy unless the backend can tell without moving its matcher."""
        return self._closing_copy().completes(tokens)

    # -- the Guide protocol ----------------------------------------------------------------

    @property
    def num_advanced(self) -> int:
        """How many tokens this guide has advanced over (and not rolled back)."""
        return self._advanced

    @property
    def tokens_left(self) -> int | None:
        """Budget left (max_new_tokens minus tokens advanced), or None without a budget."""
        return None if self.max_new_tokens is None else self.max_new_tokens - self._advanced

    def allowed_mask(self) -> torch.Tensor:
        """(V,) bool of the tokens the grammar allows next (eos only where accepting);
        memoized until the next advance or rollback; do not write into it."""
        if self._mask is None:
            self._mask = self._fill_mask()
        return self._mask

    def advance(self, token_id: int) -> None:
        """Consumes `token_id`; raises GrammarError if the grammar does not allow it."""
        if token_id == self.eos_token_id:
            raise GrammarError(f"eos is not advanced over (after {self._advanced} tokens)")
        why = self._consume(token_id)
        if why is not None:
            raise GrammarError(
                f"token {token_id} is not allowed (after {self._advanced} tokens): {why}"
            )
        if self.closer is not None:
            self.closer.advanced(self._advanced, token_id)
        self._advanced += 1
        self._mask = None

    def budget_substitute(self, token_id: int) -> int:
        """The token to emit in place of sampled `token_id` before it is advanced over: itself,
        unless no known completion fits the tokens left after it; then the next token of the
        completion kept (eos where the output is already complete) and `budget_closed` is set.
        Call from the thread that advances, after the step's mask was used."""
        left = self.tokens_left
        if self.closer is None or left is None or left <= 0:
            return token_id
        chosen = self.closer.substitute(self._advanced, left, token_id)
        if chosen != token_id:
            self.budget_closed = True
        return chosen

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces from here (jump-forward), possibly none; none when
        no known completion would fit after them (sampling, under the rule, goes on)."""
        forced = self._forced()
        left = self.tokens_left
        if self.closer is None or left is None or not forced:
            return forced
        if len(forced) > left or not self.closer.fits_forced(self._advanced, left, forced):
            return []
        return forced

    def plan_jump_forward(self, tokenizer: Any, output_ids: list[int]) -> JumpForward | None:
        """The backend's own forced tokens (`forced_tokens`), appended without retokenizing;
        None when there are none."""
        ids = self.forced_tokens()
        if not ids:
            return None
        return JumpForward(keep=len(output_ids), new_ids=ids, forced_text=tokenizer.decode(ids))

    def apply_jump_forward(self, jf: JumpForward) -> bool:
        """Rolls back to `jf.keep` advances (none for this guide's own plans) and advances over
        `jf.new_ids`; `forced_tokens` already checked that they fit the budget."""
        self.rollback(self._advanced - jf.keep)
        for token_id in jf.new_ids:
            self.advance(token_id)
        return True

    def rollback(self, n: int) -> None:
        """Undoes the last `n` advances."""
        if not 0 <= n <= self._advanced:
            raise ValueError(f"rollback needs 0 <= n <= {self._advanced} advances, got {n}")
        if n:
            self._rollback(n)
            self._advanced -= n
            self._mask = None
            if self.closer is not None:
                self.closer.rolled_back()

    def is_finished(self) -> bool:
        """Whether nothing but eos can follow (the request stops without a forward)."""
        if not self.is_accepting():
            # NOTE: eos is barred, so some other token is allowed (a matcher with no way on is
            # refused at _consume). Skipping the mask here leaves it to the step's prefetch
            # worker, which computes it beside the next forward (mask_prefetch.py).
            return False
        mask = self.allowed_mask()
        others = bool(mask[: self.eos_token_id].any()) or bool(mask[self.eos_token_id + 1 :].any())
        return not others

    def validate(self, text: str) -> str | None:
        """None when `text` satisfies the request's JSON Schema or regex (for `ebnf`: when this
        guide's matcher accepts what it was advanced over); else why not."""
        if self.constraint is None or self.constraint[0] == "ebnf":
            return (
                None if self.is_accepting() else "output is not a complete sentence of the grammar"
            )
        kind, pattern = self.constraint
        return check_output(kind, pattern, text)

    def meta_info(self, text: str) -> dict[str, Any]:
        """`budget_closed` (the closer replaced a sampled token), `budget_cut` (the output
        ended before the grammar completed) and `constraint_violation` (None when valid),
        computed and counted once."""
        if self._meta is None:
            cut = not self.is_accepting()
            if cut:
                left = "" if self.tokens_left is None else f" ({self.tokens_left} tokens left)"
                violation: str | None = (
                    f"output is cut after {self._advanced} tokens before the grammar completes"
                    f"{left}; this backend's closer found no completion within the budget: "
                    "raise max_new_tokens or use grammar_backend 'outlines'"
                )
            else:
                violation = self.validate(text)
            self._meta = {
                "budget_closed": self.budget_closed,
                "budget_cut": cut,
                "constraint_violation": violation,
            }
            if self.budget_closed:
                COUNTERS.add("budget_closed")
            if violation is not None:
                COUNTERS.add("constraint_violations")
        return dict(self._meta)

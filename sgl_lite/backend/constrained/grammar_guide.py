"""What the two grammar-backend cursors (llguidance's LLGuide, xgrammar's XGGuide) share: the
budget bookkeeping, the mask memo, and the final validation with its meta flags.

Neither backend can say how many tokens the shortest completion takes, so neither can keep an
output inside `max_new_tokens` the way the automaton's distance table does. What they can say
is whether the text so far is complete; an output the budget cut before that is flagged
(`budget_cut`) and reported as a violation, never passed off as valid. A complete output is
still checked against the request's JSON Schema or regex, which catches what a backend only
approximates (xgrammar's `oneOf` as `anyOf`, keywords it does not enforce).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from sgl_lite.backend.constrained.fidelity import COUNTERS, check_output


class BackendGuide(ABC):
    """The Guide interface over a grammar backend's matcher; subclasses give the matcher ops
    (`_fill_mask`, `_consume`, `_rollback`, `is_accepting`, `forced_tokens`)."""

    def __init__(
        self, eos_token_id: int, max_new_tokens: int | None, constraint: tuple[str, Any] | None
    ) -> None:
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint
        self.budget_closed = False  # never: these backends cannot steer toward a close
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
    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces from here (jump-forward), possibly none."""

    # -- the Guide interface ---------------------------------------------------------------

    @property
    def num_advanced(self) -> int:
        """How many tokens this guide has advanced over (and not rolled back)."""
        return self._advanced

    @property
    def tokens_left(self) -> int | None:
        """Budget left, or None without a budget (informational on these backends)."""
        return None if self.max_new_tokens is None else self.max_new_tokens - self._advanced

    def allowed_mask(self) -> torch.Tensor:
        """(V,) bool of the tokens the grammar allows next (eos only where accepting);
        memoized until the next advance or rollback; do not write into it."""
        if self._mask is None:
            self._mask = self._fill_mask()
        return self._mask

    def advance(self, token_id: int) -> None:
        """Consumes `token_id`; raises GrammarError if the grammar does not allow it."""
        from sgl_lite.backend.constrained.regex_check import GrammarError

        if token_id == self.eos_token_id:
            raise GrammarError(f"eos is not advanced over (after {self._advanced} tokens)")
        why = self._consume(token_id)
        if why is not None:
            raise GrammarError(
                f"token {token_id} is not allowed (after {self._advanced} tokens): {why}"
            )
        self._advanced += 1
        self._mask = None

    def rollback(self, n: int) -> None:
        """Undoes the last `n` advances."""
        if not 0 <= n <= self._advanced:
            raise ValueError(f"rollback needs 0 <= n <= {self._advanced} advances, got {n}")
        if n:
            self._rollback(n)
            self._advanced -= n
            self._mask = None

    def is_finished(self) -> bool:
        """Whether nothing but eos can follow (the request stops without a forward)."""
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
        """`budget_closed` (always False), `budget_cut` (the output ended before the grammar
        completed) and `constraint_violation` (None when valid), computed and counted once."""
        if self._meta is None:
            cut = not self.is_accepting()
            if cut:
                left = "" if self.tokens_left is None else f" ({self.tokens_left} tokens left)"
                violation: str | None = (
                    f"output is cut after {self._advanced} tokens before the grammar completes"
                    f"{left}; this backend gives no budget guarantee: raise max_new_tokens or "
                    "use grammar_backend 'outlines'"
                )
            else:
                violation = self.validate(text)
            self._meta = {
                "budget_closed": False,
                "budget_cut": cut,
                "constraint_violation": violation,
            }
            if violation is not None:
                COUNTERS.add("constraint_violations")
        return dict(self._meta)

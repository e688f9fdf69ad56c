"""The two shapes every constraint backend takes: a shared `Grammar` and a per-request `Guide`.

The outlines-core automaton (automaton/), llguidance and xgrammar (matchers/) each implement
both. Callers outside constrained/ (the scheduler attaching guides, the sampler and the mask
prefetch masking logits, the output processor advancing, jumping forward and validating) see
only these protocols and never ask which backend they hold. Nothing here is implemented.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

Constraint = tuple[str, Any]  # a request's (kind, pattern), read only by the final validation


class JumpForward(NamedTuple):
    """Replace output_ids[keep:] by new_ids; `forced_text` is what the grammar forced."""

    keep: int
    new_ids: list[int]
    forced_text: str


class Guide(Protocol):
    """Where one request stands in its grammar: mask, advance, roll back, jump, validate.

    The output processor calls `allowed_mask()` before sampling (through the sampler or the
    mask prefetch), then `budget_substitute(token)` and `advance(token)` after (never with
    eos), and stops the request when `is_finished()` or when eos is emitted; at the end
    `meta_info(text)` checks the text. A guide counts the tokens it advanced over (sampled and
    jump-forward alike) against the `max_new_tokens` it was made with, and keeps the output
    completable within it.
    """

    @property
    def eos_token_id(self) -> int:
        """The token that ends the output (allowed by the mask only where it is complete)."""

    @property
    def num_advanced(self) -> int:
        """How many tokens this guide has advanced over (and not rolled back)."""

    @property
    def tokens_left(self) -> int | None:
        """Budget left (max_new_tokens minus tokens advanced), or None without a budget."""

    def allowed_mask(self) -> torch.Tensor:
        """(V,) bool, True = allowed next (eos only where complete); do not write into it."""

    def advance(self, token_id: int) -> None:
        """Moves over `token_id` (never eos); GrammarError if the grammar does not allow it."""

    def rollback(self, n: int) -> None:
        """Undoes the last `n` advances (ValueError unless 0 <= n <= num_advanced)."""

    def is_accepting(self) -> bool:
        """Whether the output so far is complete (eos is allowed)."""

    def is_finished(self) -> bool:
        """Whether nothing but eos can follow: the request stops without another forward."""

    def budget_substitute(self, token_id: int) -> int:
        """The token to emit for sampled `token_id`, before it is advanced over: itself, or
        the budget's replacement (eos where the output is already complete) when no known
        completion fits the tokens left after it. Call after the step's mask was used."""

    def plan_jump_forward(self, tokenizer: Any, output_ids: list[int]) -> JumpForward | None:
        """What to splice into `output_ids` (all advanced over) when the grammar forces text
        from here; None when nothing is forced or the jump would not fit the budget."""

    def apply_jump_forward(self, jf: JumpForward) -> bool:
        """Rolls back to `jf.keep` advances and advances over `jf.new_ids`; False, with the
        guide untouched, when the jump does not fit (the caller must not jump)."""

    def meta_info(self, text: str) -> dict[str, Any]:
        """The final validation of the finished `text`: `budget_closed` and
        `constraint_violation` (None when valid), computed and counted once."""


class Grammar(Protocol):
    """A compiled constraint over one tokenizer, shared by every request using it (cached by
    the compiler per (backend, source)); immutable apart from its memo caches."""

    @property
    def backend(self) -> str:
        """Which backend built it: "outlines", "llguidance" or "xgrammar"."""

    @property
    def vocab_size(self) -> int:
        """The width of its masks."""

    @property
    def eos_token_id(self) -> int:
        """The tokenizer's eos token, allowed by the masks only where the output is complete."""

    @property
    def min_tokens(self) -> int:
        """Tokens in the shortest output it accepts, as far as the backend knows (a budget
        below it is refused by `new_guide`)."""

    def new_guide(
        self, *, max_new_tokens: int | None = None, constraint: Constraint | None = None
    ) -> Guide:
        """A fresh cursor for one request, keeping its output completable within
        `max_new_tokens`; raises BudgetError when the budget is below `min_tokens`.
        `constraint` is the request's (kind, pattern), for the final validation."""

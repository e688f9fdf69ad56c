"""CompiledGrammar: one regex's automaton over one vocabulary, shared by every request using it.

Immutable apart from its memo caches (per-state masks, forced bytes, budget masks); it knows
nothing about requests. It is the automaton's `Grammar` (protocols.py); the per-request cursor
is `guide.AutomatonGuide`; the distance table behind the budget rule is `budget.BudgetTable`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from outlines_core import Index

from sgl_lite.backend.constrained.automaton.budget import BudgetTable
from sgl_lite.backend.constrained.automaton.guide import AutomatonGuide
from sgl_lite.backend.constrained.protocols import Constraint
from sgl_lite.backend.constrained.vocab import BYTE_EOS_ID, TokenVocabulary

DEFAULT_MASK_CACHE_STATES = 512
MAX_FORCED_BYTES = 4096


class CompiledGrammar:
    """A compiled regex over one tokenizer's vocabulary, shared by every request using it.

    `index` is the token-level outlines-core Index; `byte_index` is the same regex over the
    256 single bytes (for jump-forward). Both use the regex DFA's own state ids, so a state of
    `index` is the same state in `byte_index` (tests/tokenizer/test_constrained_guide.py).
    `budget` holds the fewest tokens from each state to an accepting state.
    """

    def __init__(
        self,
        regex: str,
        index: Index,
        byte_index: Index,
        vocab: TokenVocabulary,
        *,
        mask_cache_states: int = DEFAULT_MASK_CACHE_STATES,
    ) -> None:
        self.regex = regex
        self.index = index
        self.byte_index = byte_index
        self.vocab = vocab
        self.eos_token_id = vocab.eos_token_id
        self.vocab_size = vocab.size
        self.initial_state: int = index.get_initial_state()
        self.forced: dict[int, bytes] = {}  # state → forced continuation, see forced_bytes
        self.budget = BudgetTable(index, byte_index, vocab)
        self._mask_cache_states = mask_cache_states
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._num_allowed: dict[int, int] = {}  # state → allowed tokens other than eos
        self._lock = threading.Lock()

    backend = "outlines"
    # NOTE: False only to measure what budget awareness costs and buys (bench W3B): guides then
    # ignore max_new_tokens, as every other runtime does, and a cut output is reported.
    budget_aware = True

    def new_guide(
        self, *, max_new_tokens: int | None = None, constraint: Constraint | None = None
    ) -> AutomatonGuide:
        """A budget-aware cursor for one request (see guide.AutomatonGuide; raises BudgetError)."""
        budget = max_new_tokens if self.budget_aware else None
        return AutomatonGuide(self, max_new_tokens=budget, constraint=constraint)

    @property
    def min_tokens(self) -> int:
        """Tokens in the shortest output this grammar accepts (from the initial state)."""
        return self.budget.dist(self.initial_state)

    def mask(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """Allowed tokens in `state` as a (vocab_size,) bool tensor; eos only where accepting.

        With `tokens_left` (the request's budget, this token included) a token is allowed only
        if an accepting state stays reachable within the tokens left after it. Cached per state
        (LRU); callers must not write into it.
        """
        if tokens_left is not None and self.budget.restricts(state, tokens_left - 1):
            return self.budget.mask(state, tokens_left - 1, self.is_accepting(state))
        with self._lock:
            hit = self._masks.get(state)
            if hit is not None:
                self._masks.move_to_end(state)
                return hit
        allowed = self.index.get_allowed_tokens(state) or []
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        if allowed:
            mask[torch.tensor(allowed, dtype=torch.long)] = True
        with self._lock:
            self._num_allowed[state] = len(allowed) - int(self.eos_token_id in allowed)
            self._masks[state] = mask
            while len(self._masks) > self._mask_cache_states:
                self._masks.popitem(last=False)
        return mask

    def budget_restricts(self, state: int, tokens_left: int) -> bool:
        """Whether `tokens_left` rules out a token the grammar alone allows in `state`."""
        return self.budget.restricts(state, tokens_left - 1)

    def num_allowed(self, state: int) -> int:
        """How many tokens other than eos are allowed in `state`."""
        n = self._num_allowed.get(state)
        if n is None:
            self.mask(state)
            n = self._num_allowed[state]
        return n

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after `token_id`, or None if the token is not allowed (eos included)."""
        if token_id == self.eos_token_id:
            return None
        return self.index.get_next_state(state, token_id)

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far is a full match (eos is allowed)."""
        return bool(self.index.is_final_state(state))

    def is_finished(self, state: int, tokens_left: int | None = None) -> bool:
        """Whether nothing but eos can follow: the request stops without another forward.

        With `tokens_left`, also when no token keeps an accepting state within the budget.
        """
        if self.num_allowed(state) == 0:
            return True
        if tokens_left is None or tokens_left - 1 >= self.budget.max_finite:
            return False
        return not self.budget.can_continue(state, tokens_left - 1)

    def fits(self, state: int, tokens_left: int) -> bool:
        """Whether an accepting state is reachable from `state` within `tokens_left` tokens."""
        return self.budget.dist(state) <= tokens_left

    def forced_bytes(self, state: int) -> bytes:
        """The only continuation from `state`, up to a branch or an accepting state (memoized):
        what jump-forward appends without sampling."""
        hit = self.forced.get(state)
        if hit is not None:
            return hit
        out = bytearray()
        index = self.byte_index
        s = state
        while len(out) < MAX_FORCED_BYTES and not index.is_final_state(s):
            allowed = index.get_allowed_tokens(s)
            if not allowed or len(allowed) != 1 or allowed[0] == BYTE_EOS_ID:
                break
            nxt = index.get_next_state(s, allowed[0])
            if nxt is None:
                break
            out.append(allowed[0])
            s = nxt
        self.forced[state] = bytes(out)
        return self.forced[state]

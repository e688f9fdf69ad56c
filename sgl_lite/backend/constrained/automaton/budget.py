"""Token budgets: for every automaton state, the fewest tokens that still reach an accepting state.

Computed once per compiled grammar (off the engine loop) by a reverse breadth-first search from
the accepting states. Two graphs can feed the search:

- exact: the token-level transitions of the outlines-core Index (state --token--> state), used
  when the grammar is small enough to list them all (a few wide "any character" states);
- bound: the real token edges of the narrow states (keys, separators, numbers) and, in the
  wide states, only the bytes that are a one-token string of the vocabulary. Every edge of that
  graph is a real token transition, so its distances are an upper bound on the true token
  distance, and the bound is consistent: from any state within the bound, some allowed token
  keeps the next state within the bound minus one. SmolLM2's byte-level BPE lacks 21 single
  bytes (0x04, 0x06, 0xC0, 0xC1, 0xF5-0xFF...), which the restriction handles.

Both give a distance `d` with the property the mask rule needs: a token t is allowed with `r`
tokens left iff `d(next(s, t)) <= r - 1`, and then an accepting state stays reachable. This module
knows nothing about requests or the engine.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch

from sgl_lite.backend.constrained.vocab import BYTE_EOS_ID, TokenVocabulary

UNREACHABLE = 1 << 30
# NOTE: a state whose byte fan-out reaches WIDE_FANOUT stands for "any character" and has up to
# as many token transitions as the vocabulary (~6k on average for SmolLM2's JSON strings);
# listing them costs ~0.45 µs each, so the exact table is built only for grammars with at most
# EXACT_MAX_WIDE_STATES such states (a JSON string takes 8).
WIDE_FANOUT = 32
EXACT_MAX_WIDE_STATES = 64
DEFAULT_BUDGET_MASK_CACHE = 256


def shortest_completions(
    edges: Mapping[int, Iterable[int]], accepting: Iterable[int]
) -> dict[int, int]:
    """Fewest edges from each state to an accepting state (reverse BFS over `edges`).

    `edges[s]` are the states one step from `s`. States that cannot reach an accepting state
    are absent from the result.
    """
    reverse: dict[int, list[int]] = {}
    for src, dsts in edges.items():
        for dst in set(dsts):
            reverse.setdefault(dst, []).append(src)
    dist = {s: 0 for s in accepting}
    queue = deque(dist)
    while queue:
        s = queue.popleft()
        d = dist[s] + 1
        for prev in reverse.get(s, ()):
            if prev not in dist:
                dist[prev] = d
                queue.append(prev)
    return dist


class StateEdges(NamedTuple):
    """One state's token transitions: token ids, the distance of the state each leads to, and
    the smallest and largest finite of those distances (above `max_dist` the budget restricts
    nothing; `min_dist` is UNREACHABLE when no token leads anywhere)."""

    tokens: torch.Tensor  # (E,) long
    next_dist: torch.Tensor  # (E,) long; UNREACHABLE where no accepting state follows
    min_dist: int
    max_dist: int


class BudgetTable:
    """Distances per state for one grammar, and budget-restricted masks built from them.

    `dist(s)` is the fewest tokens from `s` to an accepting state (exact or a safe upper bound,
    see the module docstring; `exact` says which). Per-state edges are listed eagerly for the
    exact table and on first use otherwise; restricted masks are LRU-cached per (state, tokens
    left after the next one).
    """

    def __init__(self, index: Any, byte_index: Any, vocab: TokenVocabulary) -> None:
        self._index = index
        self._eos = vocab.eos_token_id
        self._size = vocab.size
        accepting = list(index.get_final_states())
        byte_edges = byte_index.get_transitions()
        wide = sum(1 for m in byte_edges.values() if len(m) >= WIDE_FANOUT)
        self._edges: dict[int, StateEdges] = {}
        self.exact = wide <= EXACT_MAX_WIDE_STATES
        if self.exact:
            transitions = index.get_transitions()
            graph = {s: [n for t, n in m.items() if t != self._eos] for s, m in transitions.items()}
            self._dist = shortest_completions(graph, accepting)
            for s, m in transitions.items():
                self._edges[s] = self._make_edges(
                    [t for t in m if t != self._eos], [n for t, n in m.items() if t != self._eos]
                )
        else:
            # Narrow states (keys, separators, numbers) get their real token edges; wide ones
            # only the one-token bytes, which keeps the listing small and the bound consistent.
            one_token = {b[0] for b in vocab.token_bytes if b is not None and len(b) == 1}
            graph = {}
            for s, m in byte_edges.items():
                if len(m) < WIDE_FANOUT:
                    graph[s] = self._token_successors(s)
                else:
                    graph[s] = [n for b, n in m.items() if b != BYTE_EOS_ID and b in one_token]
            self._dist = shortest_completions(graph, accepting)
        self.max_finite = max(self._dist.values(), default=0)
        self._masks: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def dist(self, state: int) -> int:
        """Fewest tokens from `state` to an accepting state (UNREACHABLE if none)."""
        return self._dist.get(state, UNREACHABLE)

    def edges(self, state: int) -> StateEdges:
        """`state`'s token transitions (eos excluded) with the distance after each."""
        hit = self._edges.get(state)
        if hit is None:
            tokens = [t for t in self._index.get_allowed_tokens(state) or [] if t != self._eos]
            nxt = [self._index.get_next_state(state, t) for t in tokens]
            hit = self._make_edges(tokens, nxt)
            with self._lock:
                self._edges[state] = hit
        return hit

    def restricts(self, state: int, left_after: int) -> bool:
        """Whether `left_after` tokens after the next one rule out some token the grammar allows."""
        if left_after >= self.max_finite:
            return False  # every reachable distance fits: cheap answer, no edge listing
        return left_after < self.edges(state).max_dist

    def can_continue(self, state: int, left_after: int) -> bool:
        """Whether some non-eos token keeps an accepting state within `left_after` more tokens."""
        return self.edges(state).min_dist <= left_after

    def mask(self, state: int, left_after: int, accepting: bool) -> torch.Tensor:
        """(vocab_size,) bool: tokens whose next state is within `left_after` tokens of
        accepting, plus eos where `accepting`. Cached; callers must not write into it."""
        key = (state, left_after)
        with self._lock:
            hit = self._masks.get(key)
            if hit is not None:
                self._masks.move_to_end(key)
                return hit
        e = self.edges(state)
        mask = torch.zeros(self._size, dtype=torch.bool)
        mask[e.tokens[e.next_dist <= left_after]] = True
        mask[self._eos] = accepting
        with self._lock:
            self._masks[key] = mask
            while len(self._masks) > DEFAULT_BUDGET_MASK_CACHE:
                self._masks.popitem(last=False)
        return mask

    def _token_successors(self, state: int) -> list[int]:
        out = []
        for t in self._index.get_allowed_tokens(state) or []:
            if t != self._eos:
                n = self._index.get_next_state(state, t)
                if n is not None:
                    out.append(n)
        return out

    def _make_edges(self, tokens: list[int], nxt: list[int | None]) -> StateEdges:
        dist = [UNREACHABLE if n is None else self._dist.get(n, UNREACHABLE) for n in nxt]
        finite = [d for d in dist if d < UNREACHABLE]
        return StateEdges(
            torch.tensor(tokens, dtype=torch.long),
            torch.tensor(dist, dtype=torch.long),
            min(dist, default=UNREACHABLE),
            max(finite, default=-1),
        )

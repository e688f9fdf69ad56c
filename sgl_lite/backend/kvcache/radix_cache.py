"""Token-level radix tree (page size 1) mapping token prefixes to KV slot ids.

The tree holds only slot ids, never KV tensors: storage lives in `KVPool`, and whoever moves
slots between the two does so explicitly (`pool.free(cache.evict(n))`). The tree knows nothing
about requests beyond reference counts (`lock`/`unlock`) that protect a prefix from eviction.

Who owns which slots of a request whose prompt is `ids`, after `n = insert(ids, slots)`:

    ids[0 : cached_len]    slots came from the request's own `match_prefix`: the tree's slots
    ids[cached_len : n]    cached meanwhile by another request: duplicates, the caller frees them
    ids[n :]               now owned by the tree

`cached_len <= n` always; `slots[:n]` are never taken by the tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

from sgl_lite.common import common_prefix_len

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One edge of the tree: `key` token ids and the `value` slot ids that hold their KV."""

    __slots__ = ("children", "hits", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None = None,
        lock_ref: int = 0,
        last_access: int = 0,
        hits: int = 0,
    ) -> None:
        self.key = key
        self.value = value  # (len(key),) int64 slot ids on CPU
        self.children: dict[int, TreeNode] = {}  # keyed by the child's first token
        self.parent = parent
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.hits = hits  # match_prefix lookups whose matched prefix covers this node

    @property
    def is_leaf(self) -> bool:
        """True when the node has no children."""
        return not self.children

    def __repr__(self) -> str:
        n_children = len(self.children)
        return f"TreeNode(len={len(self.key)}, lock_ref={self.lock_ref}, children={n_children})"


class MatchResult(NamedTuple):
    """Longest cached prefix: its slot ids (int64, one per matched token) and deepest node."""

    slot_ids: torch.Tensor
    node: TreeNode


class NodeExport(NamedTuple):
    """A read-only copy of one node; `children` are ordered by their first token."""

    token_ids: tuple[int, ...]
    num_slots: int
    lock_ref: int
    last_access: int
    hits: int
    children: tuple[NodeExport, ...]


class TreeExport(NamedTuple):
    """A read-only copy of the whole tree with its counters, taken at one instant."""

    root: NodeExport
    cached_tokens: int
    protected_tokens: int
    evicted_tokens: int


class SplitResult(NamedTuple):
    """Execution plan for a prompt: the cached part, the part to compute, and its length."""

    hit_prefix: list[int]
    miss_suffix: list[int]
    hit_len: int


def _as_token_list(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(t) for t in ids]


class RadixCache:
    """Radix tree over token ids whose values are KV slot ids, with LRU eviction of leaves."""

    def __init__(self) -> None:
        self.root = TreeNode([], _EMPTY)
        self._clock = itertools.count(1)  # monotonic access counter for LRU
        # NOTE: counters are kept incrementally; check_integrity recomputes them from the tree.
        self._cached = 0
        self._protected = 0
        self.evictions = 0  # tokens evicted so far

    # ---------------------------------------------------------------- counters

    @property
    def cached_tokens(self) -> int:
        """Total tokens held by the tree."""
        return self._cached

    @property
    def evictable_tokens(self) -> int:
        """Tokens in nodes with lock_ref == 0."""
        return self._cached - self._protected

    @property
    def protected_tokens(self) -> int:
        """Tokens in locked nodes (lock_ref > 0)."""
        return self._protected

    # ---------------------------------------------------------------- lookup and insert

    def match_prefix(
        self, ids: Sequence[int] | torch.Tensor, *, count_hit: bool = True
    ) -> MatchResult:
        """Longest cached prefix of `ids`.

        Splits a node on a partial match so that the returned node ends exactly at the match
        (the root if nothing matches), marks the path as recently used and, unless `count_hit`
        is False (a planning probe, a request re-finding its own tokens), counts a hit on every
        node of it.
        """
        tokens = _as_token_list(ids)
        node, _, values = self._walk(tokens)
        hit: TreeNode | None = node if count_hit else None
        while hit is not None:  # the root's count is the number of lookups
            hit.hits += 1
            hit = hit.parent
        slot_ids = torch.cat(values) if values else _EMPTY.clone()
        return MatchResult(slot_ids, node)

    def insert(self, ids: Sequence[int] | torch.Tensor, slot_ids: torch.Tensor) -> int:
        """Cache `ids` with their KV in `slot_ids`; returns how many leading tokens were cached.

        With `n` the return value, the tree takes ownership of `slot_ids[n:]` and leaves
        `slot_ids[:n]` with the caller (who frees the ones that duplicate the tree's). An empty
        `ids` is a ValueError: the tree has no empty edges, and a caller that inserts nothing
        has a bug upstream.
        """
        tokens = _as_token_list(ids)
        if not tokens:
            raise ValueError("RadixCache.insert: expected a non-empty token path, got []")
        slots = torch.as_tensor(slot_ids).to("cpu", torch.int64)
        if slots.dim() != 1 or slots.shape[0] != len(tokens):
            raise ValueError(
                f"RadixCache.insert: expected slot_ids of shape ({len(tokens)},), "
                f"got {tuple(slots.shape)}"
            )
        node, pos, _ = self._walk(tokens)
        if pos < len(tokens):
            # NOTE: _walk stopped either at a missing child or at a partial match that it split,
            # so `node` has no child starting with tokens[pos].
            leaf = TreeNode(
                tokens[pos:], slots[pos:].clone(), parent=node, last_access=node.last_access
            )
            node.children[tokens[pos]] = leaf
            self._cached += len(leaf.key)
        return pos

    def split_prompt(self, ids: Sequence[int] | torch.Tensor) -> SplitResult:
        """The execution plan for `ids`: cached prefix, uncached suffix, and the hit length.

        Uses `match_prefix` (without counting a hit), so it also refreshes the prefix's LRU
        position. A fully cached
        prompt gives an empty `miss_suffix`; a caller that needs logits for the last token
        should plan on `ids[:-1]`.
        """
        tokens = _as_token_list(ids)
        hit_len = len(self.match_prefix(tokens, count_hit=False).slot_ids)
        return SplitResult(tokens[:hit_len], tokens[hit_len:], hit_len)

    def _walk(self, tokens: list[int]) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow `tokens` down the tree, splitting at a partial match and touching the path."""
        now = next(self._clock)
        node, pos, values = self.root, 0, []
        node.last_access = now
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            common = common_prefix_len(child.key, tokens, pos)
            partial = common < len(child.key)
            if partial:
                child = self._split(child, common)
            child.last_access = now
            values.append(child.value)
            node, pos = child, pos + common
            if partial:
                break
        return node, pos, values

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut `child` after `k` tokens; returns the new upper node. `child` keeps the lower part.

        NOTE: the original object stays the deeper node, so a request that holds it (and its
        locks) still ends at the same token. The upper node inherits lock_ref: it lies on every
        locked path through `child`.
        """
        parent = child.parent
        assert parent is not None and 0 < k < len(child.key)
        upper = TreeNode(
            child.key[:k], child.value[:k], parent, child.lock_ref, child.last_access, child.hits
        )
        child.key, child.value = child.key[k:], child.value[k:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    # ---------------------------------------------------------------- locks and eviction

    def lock(self, node: TreeNode) -> None:
        """Protect the path from `node` up to the root from eviction (lock_ref += 1)."""
        for n in self._path(node):
            if n.lock_ref == 0:
                self._protected += len(n.key)
            n.lock_ref += 1

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`; raises ValueError if a lock count would go negative."""
        path = self._path(node)
        if any(n.lock_ref <= 0 for n in path):
            raise ValueError(f"RadixCache.unlock: expected a locked node, got {node!r}")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._protected -= len(n.key)

    def _path(self, node: TreeNode) -> list[TreeNode]:
        path = []
        n: TreeNode | None = node
        while n is not self.root:
            if n is None:
                raise ValueError(f"RadixCache: node {node!r} is not in this tree (evicted?)")
            path.append(n)
            n = n.parent
        return path

    def evict(self, n: int) -> torch.Tensor:
        """Remove least-recently-used unlocked leaves until >= `n` tokens are freed (or no
        unlocked leaf is left); returns the evicted slot ids for the caller to free.

        A parent left without children becomes a candidate in turn. Cost: one pass to collect
        leaves plus O(k log k) for k evicted nodes.
        """
        if n <= 0:
            return _EMPTY.clone()
        seq = itertools.count()
        heap = [(leaf.last_access, next(seq), leaf) for leaf in self._evictable_leaves()]
        heapq.heapify(heap)
        evicted: list[torch.Tensor] = []
        freed = 0
        while freed < n and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            leaf.parent = None
            evicted.append(leaf.value)
            freed += len(leaf.key)
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(seq), parent))
        self._cached -= freed
        self.evictions += freed
        return torch.cat(evicted) if evicted else _EMPTY.clone()

    def _evictable_leaves(self) -> Iterator[TreeNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.is_leaf and node is not self.root and node.lock_ref == 0:
                yield node
            stack.extend(node.children.values())

    def reset(self) -> torch.Tensor:
        """Drop every node and return all slot ids the tree held; ValueError if any lock is held."""
        if self._protected:
            raise ValueError(
                f"RadixCache.reset: expected no locks, got {self._protected} protected tokens"
            )
        slots = self.all_slot_ids()
        self.root = TreeNode([], _EMPTY)
        self._cached = 0
        return slots

    # ---------------------------------------------------------------- inspection

    def _nodes(self) -> Iterator[TreeNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def export(self) -> TreeExport:
        """A read-only copy of the tree (tokens, locks, last access, hits), children ordered by
        first token. Built without recursion, so any depth of splits is fine."""
        copies: dict[int, NodeExport] = {}
        order: list[TreeNode] = []  # parents before children
        stack = [self.root]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        for node in reversed(order):  # children are copied before their parent
            kids = tuple(copies.pop(id(node.children[t])) for t in sorted(node.children))
            copies[id(node)] = NodeExport(
                tuple(node.key), len(node.value), node.lock_ref, node.last_access, node.hits, kids
            )
        return TreeExport(copies[id(self.root)], self._cached, self._protected, self.evictions)

    def all_slot_ids(self) -> torch.Tensor:
        """Every slot id held by the tree, as one int64 CPU tensor."""
        values = [node.value for node in self._nodes()]
        return torch.cat(values) if values else _EMPTY.clone()

    def check_integrity(self) -> None:
        """Recompute the tree's invariants and counters; raise AssertionError on any mismatch."""

        def fail(msg: str) -> None:
            raise AssertionError(f"RadixCache integrity: {msg}")

        root = self.root
        if root.key or root.value.numel() or root.parent is not None or root.lock_ref:
            fail("root must be empty, parentless and unlocked")
        cached = protected = 0
        for node in self._nodes():
            parent = node.parent
            if parent is None or not node.key:
                fail(f"{node!r} is detached or empty")
                return
            if parent.children.get(node.key[0]) is not node:
                fail(f"{node!r} is not keyed by its first token {node.key[0]} in its parent")
            if node.value.dim() != 1 or node.value.shape[0] != len(node.key):
                fail(f"{node!r} has {tuple(node.value.shape)} slot ids for {len(node.key)} tokens")
            if node.value.dtype != torch.int64:
                fail(f"{node!r} slot ids have dtype {node.value.dtype}, expected int64")
            if node.lock_ref < 0:
                fail(f"{node!r} has a negative lock_ref")
            if parent is not root and parent.lock_ref < node.lock_ref:
                fail(f"{node!r} is locked more than its parent {parent!r}")
            cached += len(node.key)
            protected += len(node.key) if node.lock_ref > 0 else 0
        if (cached, protected) != (self._cached, self._protected):
            fail(
                f"counters (cached={self._cached}, protected={self._protected}) disagree with "
                f"the tree (cached={cached}, protected={protected})"
            )
        slots = self.all_slot_ids()
        if torch.unique(slots).numel() != slots.numel():
            fail("a slot id appears more than once")

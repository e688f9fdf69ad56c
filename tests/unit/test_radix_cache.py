"""RadixCache: splits, ownership on insert, locks, LRU eviction, and a model-based property test."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sgl_lite.backend.kvcache.kv_pool import KVPool, check_slot_accounting
from sgl_lite.backend.kvcache.radix_cache import RadixCache, TreeNode


def slots(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def test_match_on_empty_tree_returns_root_and_no_slots() -> None:
    cache = RadixCache()
    m = cache.match_prefix([1, 2, 3])
    assert m.node is cache.root and m.slot_ids.numel() == 0


def test_partial_match_splits_node_at_the_match() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    m = cache.match_prefix([1, 2, 9])
    assert m.slot_ids.tolist() == [10, 11]
    assert m.node.key == [1, 2] and m.node.parent is cache.root
    (child,) = m.node.children.values()
    assert child.key == [3, 4] and child.value.tolist() == [12, 13]
    assert cache.cached_tokens == 4
    cache.check_integrity()


def test_insert_returns_count_of_already_cached_tokens() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3], slots(0, 1, 2)) == 0
    assert cache.insert([1, 2, 3, 4, 5], slots(7, 8, 9, 3, 4)) == 3
    assert cache.insert([1, 2], slots(7, 8)) == 2
    assert cache.insert([1, 6], slots(7, 5)) == 1
    # The tree took only the uncached tails; 7, 8, 9 stayed with the callers.
    assert sorted(cache.all_slot_ids().tolist()) == [0, 1, 2, 3, 4, 5]
    assert cache.match_prefix([1, 2, 3, 4, 5]).slot_ids.tolist() == [0, 1, 2, 3, 4]
    assert cache.cached_tokens == 6
    cache.check_integrity()


def test_insert_rejects_length_mismatch() -> None:
    with pytest.raises(ValueError, match="expected slot_ids"):
        RadixCache().insert([1, 2], slots(0))


def test_insert_of_an_empty_token_path_is_a_value_error() -> None:
    cache = RadixCache()
    cache.insert([1], slots(0))
    with pytest.raises(ValueError, match="non-empty token path"):
        cache.insert([], slots())
    with pytest.raises(ValueError, match="non-empty token path"):
        cache.insert(torch.empty(0, dtype=torch.int64), slots())
    assert cache.cached_tokens == 1
    cache.check_integrity()


def test_match_prefix_counts_hits_on_the_matched_path_and_splits_keep_them() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(0, 1, 2, 3))
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4, 9])
    (node,) = cache.root.children.values()
    assert node.hits == 2 and cache.root.hits == 2
    cache.match_prefix([1, 2, 7])  # splits [1, 2 | 3, 4]: the upper half has every hit
    upper = cache.root.children[1]
    assert upper.key == [1, 2] and upper.hits == 3
    assert upper.children[3].key == [3, 4] and upper.children[3].hits == 2
    cache.match_prefix([5])  # a miss counts on the root only
    assert cache.root.hits == 4 and upper.hits == 3
    # Planning probes and uncounted lookups leave the counts alone.
    assert cache.split_prompt([1, 2, 3]).hit_len == 3
    cache.match_prefix([1, 2], count_hit=False)
    assert cache.root.hits == 4 and upper.hits == 3


def test_export_is_a_sorted_read_only_copy_of_the_tree() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(0, 1, 2))
    cache.insert([1, 2, 4, 5], slots(9, 9, 3, 4))
    cache.insert([0], slots(5))
    locked = cache.match_prefix([1, 2, 4, 5]).node
    cache.lock(locked)
    tree = cache.export()
    assert (tree.cached_tokens, tree.protected_tokens, tree.evicted_tokens) == (6, 4, 0)
    assert [c.token_ids for c in tree.root.children] == [(0,), (1, 2)]
    shared = tree.root.children[1]
    assert shared.lock_ref == 1 and shared.hits == 1 and shared.num_slots == 2
    assert [(c.token_ids, c.lock_ref) for c in shared.children] == [((3,), 0), ((4, 5), 1)]
    # A copy: later changes to the tree do not show in it.
    cache.unlock(locked)
    cache.evict(10)
    assert tree.root.children[1].children[1].lock_ref == 1
    assert cache.export().root.children == ()
    assert cache.export().evicted_tokens == 6


def test_export_handles_a_deeper_tree_than_the_recursion_limit() -> None:
    # The limit is lowered (the test's own stack needs well under 400 frames) so that the chain
    # past it is short: building it costs O(depth**2) steps, 1.1 M under the default 1000.
    cache = RadixCache()
    limit = 400
    depth = limit + 200
    ids = list(range(depth))
    cache.insert(ids, torch.arange(depth))
    for k in range(1, depth):  # split after every token: a chain of `depth` nodes
        cache.match_prefix(ids[:k] + [-1])
    default = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        root = cache.export().root
    finally:
        sys.setrecursionlimit(default)
    node, n = root, 0
    while node.children:
        (node,) = node.children
        n += 1
    assert n == depth


def test_lock_protects_path_from_eviction() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(0, 1, 2))
    cache.insert([1, 2, 4], slots(9, 9, 3))
    node = cache.match_prefix([1, 2, 3]).node
    cache.lock(node)
    assert (cache.protected_tokens, cache.evictable_tokens) == (3, 1)
    assert cache.evict(100).tolist() == [3]
    assert cache.match_prefix([1, 2, 3]).slot_ids.tolist() == [0, 1, 2]
    cache.unlock(node)
    assert (cache.protected_tokens, cache.evictable_tokens) == (0, 3)
    assert sorted(cache.evict(100).tolist()) == [0, 1, 2]
    assert cache.cached_tokens == 0 and cache.evictions == 4
    cache.check_integrity()


def test_lock_survives_a_later_split_of_the_locked_path() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(0, 1, 2, 3))
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    cache.match_prefix([1, 2])  # splits the locked node; the upper part inherits the lock
    assert cache.protected_tokens == 4
    cache.check_integrity()
    cache.unlock(node)
    assert cache.protected_tokens == 0
    cache.check_integrity()


def test_unlock_below_zero_and_lock_of_evicted_node_raise() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(0, 1))
    node = cache.match_prefix([1, 2]).node
    with pytest.raises(ValueError, match="locked"):
        cache.unlock(node)
    cache.evict(2)
    with pytest.raises(ValueError, match="not in this tree"):
        cache.lock(node)


def test_evict_removes_least_recently_used_leaves_first() -> None:
    cache = RadixCache()
    cache.insert([1, 1], slots(0, 1))
    cache.insert([2, 2], slots(2, 3))
    cache.insert([3, 3], slots(4, 5))
    cache.match_prefix([1, 1])  # now [2, 2] is the oldest, then [3, 3]
    assert cache.evict(1).tolist() == [2, 3]  # whole leaves go; >= n tokens freed
    assert cache.evict(2).tolist() == [4, 5]
    assert cache.evict(2).tolist() == [0, 1]
    assert cache.evict(2).numel() == 0


def test_evict_cascades_to_parents_that_become_leaves() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(0, 1, 2))
    cache.insert([1, 2, 4], slots(0, 1, 3))
    assert cache.evict(1).tolist() == [2]  # [3] is older than [4]
    assert cache.evict(2).tolist() == [3, 0, 1]  # [4], then its parent [1, 2]
    assert cache.cached_tokens == 0
    cache.check_integrity()


def test_split_prompt_plans_cached_prefix_and_uncached_suffix() -> None:
    cache = RadixCache()
    cache.insert([5, 6, 7], slots(0, 1, 2))
    assert cache.split_prompt([5, 6, 8, 9]) == ([5, 6], [8, 9], 2)
    assert cache.split_prompt([5, 6, 7]) == ([5, 6, 7], [], 3)
    assert cache.split_prompt([4]) == ([], [4], 0)
    cache.check_integrity()


def test_reset_requires_no_locks_and_returns_all_slots() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(0, 1))
    cache.insert([3], slots(2))
    node = cache.match_prefix([3]).node
    cache.lock(node)
    with pytest.raises(ValueError, match="no locks"):
        cache.reset()
    cache.unlock(node)
    assert sorted(cache.reset().tolist()) == [0, 1, 2]
    assert cache.cached_tokens == 0 and cache.match_prefix([1, 2]).slot_ids.numel() == 0
    cache.check_integrity()


# ---------------------------------------------------------------- model-based property test

Prefix = tuple[int, ...]
token_seqs = st.lists(st.integers(0, 3), min_size=0, max_size=8)


class RadixCacheMachine(RuleBasedStateMachine):
    """Random insert / match / lock / unlock / evict against a reference model.

    The reference maps every cached prefix (a tuple of tokens) to the slot id of its last
    token; a prefix is cached iff it is a prefix of some inserted sequence not yet evicted.
    Slots come from a real KVPool and the test frees duplicates as the engine would.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool = KVPool(num_layers=1, num_slots=24, num_kv_heads=1, head_dim=1)
        self.cache = RadixCache()
        self.ref: dict[Prefix, int] = {}
        self.locks: list[tuple[TreeNode, Prefix]] = []

    def ref_match_len(self, ids: list[int]) -> int:
        n = 0
        while n < len(ids) and tuple(ids[: n + 1]) in self.ref:
            n += 1
        return n

    def locked_prefixes(self) -> set[Prefix]:
        return {p[:i] for _, p in self.locks for i in range(1, len(p) + 1)}

    @rule(ids=token_seqs)
    def insert(self, ids: list[int]) -> None:
        if not ids:
            with pytest.raises(ValueError):
                self.cache.insert(ids, slots())
            return
        new = self.pool.alloc(len(ids))
        if new is None:
            self.evict_and_check(len(ids) - self.pool.num_free)
            new = self.pool.alloc(len(ids))
        if new is None:
            return  # everything left is locked
        expected = self.ref_match_len(ids)
        n = self.cache.insert(ids, new)
        assert n == expected
        self.pool.free(new[:n])  # duplicates of the tree's slots: the caller's to free
        for i in range(n, len(ids)):
            self.ref[tuple(ids[: i + 1])] = int(new[i])

    @rule(ids=token_seqs)
    def match(self, ids: list[int]) -> None:
        m = self.cache.match_prefix(ids)
        n = self.ref_match_len(ids)
        assert m.slot_ids.tolist() == [self.ref[tuple(ids[: i + 1])] for i in range(n)]
        assert (m.node is self.cache.root) == (n == 0)

    @rule(ids=token_seqs)
    def lock(self, ids: list[int]) -> None:
        m = self.cache.match_prefix(ids)
        self.cache.lock(m.node)
        self.locks.append((m.node, tuple(ids[: m.slot_ids.numel()])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        node, _ = self.locks.pop(i % len(self.locks))
        self.cache.unlock(node)

    @rule(n=st.integers(0, 30))
    def evict(self, n: int) -> None:
        self.evict_and_check(n)

    def evict_and_check(self, n: int) -> None:
        evictable = self.cache.evictable_tokens
        evicted = self.cache.evict(n).tolist()
        assert len(evicted) >= min(n, evictable)
        by_slot = {s: p for p, s in self.ref.items()}
        gone = {by_slot[s] for s in evicted}
        assert not gone & self.locked_prefixes()
        for p in gone:
            del self.ref[p]
        # The reference must stay prefix-closed: nothing cached below an evicted prefix.
        assert all(p[:-1] in self.ref for p in self.ref if len(p) > 1)
        self.pool.free(evicted)

    @invariant()
    def tree_matches_reference(self) -> None:
        self.cache.check_integrity()
        held: dict[Prefix, int] = {}
        stack: list[tuple[TreeNode, Prefix]] = [(self.cache.root, ())]
        while stack:
            node, prefix = stack.pop()
            for j, slot in enumerate(node.value.tolist()):
                held[prefix + tuple(node.key[: j + 1])] = slot
            stack.extend((c, prefix + tuple(node.key)) for c in node.children.values())
        assert held == self.ref
        assert self.cache.cached_tokens == len(self.ref)
        assert self.cache.protected_tokens == len(self.locked_prefixes())
        assert self.locked_prefixes() <= self.ref.keys()
        check_slot_accounting(self.pool, self.cache, [])

    def teardown(self) -> None:
        for node, _ in self.locks:
            self.cache.unlock(node)
        self.pool.free(self.cache.reset())
        assert self.pool.num_free == self.pool.num_slots


# The example count is the hypothesis profile's (tests/conftest.py: dev small, ci larger).
RadixCacheMachine.TestCase.settings = settings(
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_matches_reference_model = RadixCacheMachine.TestCase

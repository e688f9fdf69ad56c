"""CacheManager: moves KV slots between the pool, the radix tree and running requests.

Storage (KVPool) and sharing (RadixCache) are separate objects; this is the only place where
slots change hands. For a request, `slot_ids` covers `fill_ids[:kv_len]`:

    [0, prefix_len)        held by the tree, protected by the lock on `last_node`
    [prefix_len, kv_len)   owned by the request; freed or handed to the tree when it ends

With `disable_radix_cache` the tree stays empty and every request owns all of its slots.

Prompt logprobs ride with the slots (kvcache/logprob_store.py): a request that wants them may
reuse a cached prefix as far as the stored entries reach (`logprob_match_limit`), reads them
back (`stored_logprobs`), and stores what its passes compute (`store_logprobs`); when its own
slots turn out to duplicate the tree's, their entries move to the tree's before they are freed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sgl_lite.backend.kvcache.kv_pool import KVPool, check_slot_accounting
from sgl_lite.backend.kvcache.logprob_store import TOP_K, StoredLogprobs
from sgl_lite.backend.kvcache.radix_cache import RadixCache
from sgl_lite.backend.types import Req

EMPTY = torch.empty(0, dtype=torch.long)


class CacheManager:
    """Prefix matching, allocation with eviction, and handing slots back."""

    def __init__(self, pool: KVPool, disable_radix_cache: bool = False) -> None:
        self.pool = pool
        self.tree = RadixCache()
        self.disabled = disable_radix_cache

    # --- a request's prefix -------------------------------------------------------------
    def match(self, req: Req, limit: int) -> None:
        """Gives `req` the longest cached prefix of `fill_ids[:limit]` and locks it."""
        assert req.kv_len == 0 and req.last_node is None
        if self.disabled or limit <= 0:
            return
        result = self.tree.match_prefix(req.fill_ids[:limit])
        self.tree.lock(result.node)
        req.last_node = result.node
        req.slot_ids = result.slot_ids.clone()
        req.prefix_len = len(result.slot_ids)

    def cache_unfinished(self, req: Req) -> None:
        """Hands the request's computed tokens to the tree now, so others can reuse them early."""
        if self.disabled or req.kv_len == req.prefix_len:
            return
        ids = req.fill_ids[: req.kv_len]
        already = self.tree.insert(ids, req.slot_ids)
        self._keep_logprobs(ids, req.slot_ids, req.prefix_len, already)
        # Slots the tree already had for [prefix_len, already) are duplicates: ours go back.
        self.pool.free(req.slot_ids[req.prefix_len : already])
        old = req.last_node
        result = self.tree.match_prefix(ids, count_hit=False)  # its own tokens: not a reuse
        self.tree.lock(result.node)
        if old is not None:
            self.tree.unlock(old)
        req.last_node, req.slot_ids, req.prefix_len = result.node, result.slot_ids.clone(), len(ids)

    def cache_finished(self, req: Req) -> None:
        """A finished request's prompt and output go into the tree; its other slots are freed."""
        if self.disabled:
            self.pool.free(req.slot_ids)
        else:
            ids = req.fill_ids[: req.kv_len]
            already = self.tree.insert(ids, req.slot_ids)
            self._keep_logprobs(ids, req.slot_ids, req.prefix_len, already)
            self.pool.free(req.slot_ids[req.prefix_len : already])
            if req.last_node is not None:
                self.tree.unlock(req.last_node)
        self._forget(req)

    def release(self, req: Req) -> None:
        """Drops a request's slots without caching them (abort, preemption)."""
        self.pool.free(req.owned_slots)
        if req.last_node is not None:
            self.tree.unlock(req.last_node)
        self._forget(req)

    # --- prompt logprobs kept with the slots ------------------------------------------------
    @property
    def logprob_top_k(self) -> int:
        """Top entries stored per cached token (0 with the cache off: nothing is stored)."""
        return 0 if self.disabled else TOP_K

    def logprob_match_limit(self, ids: Sequence[int], first: int, floor: int) -> int:
        """How much of `ids[:-1]` a request that wants the logprobs of positions after `first`
        may take from the cache: the prefix whose next position, and every one from `first + 1`
        up to it, has a stored entry (position p's entry needs the logits of p - 1, so the
        first computed token is the one before the first unknown entry); `floor` (the positions
        up to `first` need no entry) when that is more. A probe: nothing is locked."""
        if self.disabled:
            return min(floor, len(ids))
        slots = self.tree.match_prefix(ids, count_hit=False).slot_ids  # positions 0..L-1
        if len(slots) <= first + 1:
            return min(floor, len(slots))
        known = self.pool.logprobs.known_prefix(slots[first + 1 :])
        return max(first + known, min(floor, len(slots)))

    def stored_logprobs(self, ids: Sequence[int], first: int) -> StoredLogprobs:
        """The stored entries of positions `first + 1 .. len(ids) - 1` of the cached `ids`
        (read at once: the slot past a request's locked prefix may be evicted later)."""
        slots = self.tree.match_prefix(ids, count_hit=False).slot_ids
        assert len(slots) == len(ids), "stored_logprobs: expected a cached path"
        return self.pool.logprobs.read(slots[first + 1 :])

    def store_logprobs(
        self, slots: torch.Tensor, chosen: list[float], top: list[list[tuple[float, int]]]
    ) -> None:
        """Keeps prompt logprobs a pass computed beside the K/V of `slots` (T,)."""
        if not self.disabled:
            self.pool.logprobs.write(slots, chosen, top)

    def _keep_logprobs(self, ids: list[int], slots: torch.Tensor, start: int, end: int) -> None:
        """`slots[start:end]` duplicate the tree's slots for `ids[start:end]` and are about to
        be freed: their stored logprobs move to the tree's slots that lack them."""
        dups = slots[start:end]
        if not dups.numel() or not bool(self.pool.logprobs.known[dups].any()):
            return
        tree_slots = self.tree.match_prefix(ids[:end], count_hit=False).slot_ids[start:end]
        self.pool.logprobs.copy_known(dups, tree_slots)

    @staticmethod
    def _forget(req: Req) -> None:
        req.slot_ids, req.prefix_len, req.last_node = EMPTY, 0, None

    # --- allocation -----------------------------------------------------------------------
    def available(self) -> int:
        """Slots that can be had now: free ones plus those the tree could evict."""
        return self.pool.num_free + self.tree.evictable_tokens

    def alloc(self, n: int) -> torch.Tensor | None:
        """n free slots, evicting least-recently-used cached prefixes if needed; None if short."""
        if n > self.pool.num_free:
            self.pool.free(self.tree.evict(n - self.pool.num_free))
        return self.pool.alloc(n)

    def flush(self) -> bool:
        """Empties the tree (only when no request holds a lock); True on success."""
        if self.tree.protected_tokens:
            return False
        self.pool.free(self.tree.reset())
        return True

    def check_integrity(self, running: list[Req]) -> None:
        """Asserts that every slot is free, cached or held by exactly one running request."""
        self.tree.check_integrity()
        check_slot_accounting(self.pool, self.tree, [r.owned_slots for r in running])

    def truncate(self, req: Req, kv_len: int) -> bool:
        """Drops K/V past `kv_len` (jump-forward retokenized them); False if those slots are
        the tree's and must stay."""
        if kv_len < req.prefix_len:
            return False
        self.pool.free(req.slot_ids[kv_len:])
        req.slot_ids = req.slot_ids[:kv_len]
        return True

"""KVPool: slot allocation, KV writes, and slot accounting against a radix cache."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.kvcache.kv_pool import KVPool, check_slot_accounting
from sgl_lite.backend.kvcache.radix_cache import RadixCache


def make_pool(num_slots: int = 8) -> KVPool:
    return KVPool(num_layers=2, num_slots=num_slots, num_kv_heads=2, head_dim=4)


def test_pool_shapes_and_nbytes() -> None:
    pool = make_pool()
    assert pool.k.shape == pool.v.shape == (2, 8, 2, 4)
    assert pool.num_slots == pool.num_free == 8
    assert pool.nbytes == 2 * 2 * 8 * 2 * 4 * 4  # k + v, float32


def test_alloc_free_round_trip_returns_distinct_slots() -> None:
    pool = make_pool()
    a = pool.alloc(3)
    b = pool.alloc(5)
    assert a is not None and b is not None
    assert a.dtype == torch.int64 and a.device.type == "cpu"
    assert sorted(torch.cat([a, b]).tolist()) == list(range(8))
    assert pool.num_free == 0
    pool.free(a)
    pool.free(b.tolist())
    assert pool.num_free == 8
    assert sorted(pool.free_slot_ids().tolist()) == list(range(8))


def test_alloc_zero_is_empty() -> None:
    pool = make_pool()
    out = pool.alloc(0)
    assert out is not None and out.numel() == 0 and out.dtype == torch.int64
    assert pool.num_free == 8


def test_alloc_beyond_capacity_returns_none_and_allocates_nothing() -> None:
    pool = make_pool()
    assert pool.alloc(6) is not None
    assert pool.alloc(3) is None
    assert pool.num_free == 2
    assert pool.alloc(2) is not None


def test_free_rejects_double_free_and_out_of_range_without_side_effects() -> None:
    pool = make_pool()
    slots = pool.alloc(4)
    assert slots is not None
    pool.free(slots[:2])
    with pytest.raises(ValueError, match="double free"):
        pool.free(slots[1:3])
    with pytest.raises(ValueError, match=r"expected slot ids in \[0, 8\)"):
        pool.free([8])
    with pytest.raises(ValueError, match="distinct"):
        pool.free([int(slots[2]), int(slots[2])])
    assert pool.num_free == 6  # the failed calls freed nothing
    pool.free(slots[2:])
    assert pool.num_free == 8


def test_write_puts_values_at_the_right_slots() -> None:
    pool = make_pool()
    slots = torch.tensor([5, 1, 6])
    k = torch.randn(3, 2, 4)
    v = torch.randn(3, 2, 4)
    pool.write(1, slots, k, v)
    torch.testing.assert_close(pool.k[1, slots], k)
    torch.testing.assert_close(pool.v[1, slots], v)
    untouched = [s for s in range(8) if s not in (5, 1, 6)]
    assert pool.k[1, untouched].abs().sum() == 0
    assert pool.k[0].abs().sum() == 0 and pool.v[0].abs().sum() == 0


def test_write_rejects_mismatched_shapes() -> None:
    pool = make_pool()
    with pytest.raises(ValueError, match="expected"):
        pool.write(0, torch.tensor([0, 1]), torch.zeros(3, 2, 4), torch.zeros(3, 2, 4))


def test_slot_accounting_holds_across_free_tree_and_requests() -> None:
    pool, cache = make_pool(), RadixCache()
    slots = pool.alloc(5)
    assert slots is not None
    cache.insert([1, 2, 3], slots[:3])
    check_slot_accounting(pool, cache, [slots[3:]])
    pool.free(cache.evict(3))
    check_slot_accounting(pool, cache, [slots[3:]])


def test_slot_accounting_catches_a_leaked_slot() -> None:
    pool, cache = make_pool(), RadixCache()
    slots = pool.alloc(3)
    assert slots is not None
    cache.insert([1, 2], slots[:2])
    with pytest.raises(AssertionError, match="1 leaked"):
        check_slot_accounting(pool, cache, [])  # slots[2] has no owner


def test_slot_accounting_catches_a_double_held_slot() -> None:
    pool, cache = make_pool(), RadixCache()
    slots = pool.alloc(3)
    assert slots is not None
    cache.insert([1, 2, 3], slots)
    with pytest.raises(AssertionError, match="1 held more than once"):
        check_slot_accounting(pool, cache, [slots[2:]])  # a request still claims slots[2]

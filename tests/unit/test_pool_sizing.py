"""A CPU KV pool's size is a ceiling: its memory is committed only as slots are first written,
and fresh slots are handed out lowest first, after the ones given back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sgl_lite.backend.kvcache.kv_pool import KVPool

STATUS = Path("/proc/self/status")
MIB = 2**20


def resident_bytes() -> int:
    """This process's VmRSS (Linux)."""
    for line in STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not STATUS.exists(), reason="reads VmRSS from /proc (Linux only)")
def test_cpu_pool_commits_memory_only_for_the_slots_written() -> None:
    before = resident_bytes()
    # SmolLM2's shapes in bfloat16: 1 GiB of K and V together.
    pool = KVPool(
        num_layers=30, num_slots=46_603, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16
    )
    assert pool.nbytes > 1000 * MIB and pool.committed_on_use
    assert resident_bytes() - before < 32 * MIB  # torch.zeros would have written all of it
    assert pool.k[:, -1].abs().sum() == 0 and pool.v[:, 0].abs().sum() == 0  # reads see zeros
    slots = pool.alloc(1000)
    assert slots is not None
    rows = torch.ones(1000, 3, 64, dtype=torch.bfloat16)
    for layer in range(30):
        pool.write(layer, slots, rows, rows)
    # 1000 slots x 384 bytes x 60 layer planes is 22 MiB, plus up to a page per plane.
    grown = resident_bytes() - before
    assert 16 * MIB < grown < 64 * MIB, grown / MIB
    assert pool.k[29, slots].eq(1).all() and pool.k[29, 1000:].abs().sum() == 0


def test_fresh_slots_go_lowest_first_after_the_given_back_ones() -> None:
    pool = KVPool(num_layers=1, num_slots=10, num_kv_heads=1, head_dim=2)
    first = pool.alloc(3)
    assert first is not None and first.tolist() == [2, 1, 0]  # the stack's top: the lowest ids
    pool.free([1])
    assert pool.num_free == 8
    assert sorted(pool.free_slot_ids().tolist()) == [1, *range(3, 10)]
    mixed = pool.alloc(3)  # slot 1 comes back first, then the next fresh ones
    assert mixed is not None and mixed.tolist() == [4, 3, 1]
    rest = pool.alloc(5)
    assert rest is not None and rest.tolist() == [9, 8, 7, 6, 5] and pool.num_free == 0
    assert pool.alloc(1) is None
    pool.free([2, 0])
    pool.free(torch.cat([mixed, rest]))
    assert pool.num_free == 10 and sorted(pool.free_slot_ids().tolist()) == list(range(10))
    with pytest.raises(ValueError, match="double free"):
        pool.free([0])
    with pytest.raises(ValueError, match="double free"):  # a slot never handed out is free too
        KVPool(num_layers=1, num_slots=10, num_kv_heads=1, head_dim=2).free([5])

"""Token-slot KV storage: the only place that holds KV tensors.

`KVPool` owns `k` and `v` of shape (L, N, Hkv, D) and a free list of slot ids. It knows nothing
about prefixes, requests or the radix tree: it hands out slot ids, takes them back and writes
KV rows into them. Who holds a slot (the tree or a running request) is recorded elsewhere;
`check_slot_accounting` verifies that every slot has exactly one owner.

Slot ids are int64 CPU tensors everywhere outside this module; `write` moves them to the pool's
device when it needs to index the tensors.

On CPU the pool's size is a ceiling, not a commitment: `k` and `v` live in anonymous memory the
kernel fills with zeros page by page on first write, and slots are handed out lowest first, so
the resident set grows with the slots ever held at once, not with `num_slots`. (`torch.zeros`
would write every page at start-up: 4.4 GB resident and 15 s for a 200k-token SmolLM2 pool.)
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from sgl_lite.backend.kvcache.logprob_store import LogprobStore

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.radix_cache import RadixCache


class KVPool:
    """Token-slot KV storage: k/v tensors [L, N, Hkv, D] and a free list of slot ids."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        scratch_slots: int = 0,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_slots", num_slots),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if value <= 0:
                raise ValueError(f"KVPool: expected {name} > 0, got {value}")
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        # Scratch slots sit past num_slots, outside the free list and the slot accounting:
        # padded rows of a CUDA-graph decode write their throw-away K/V there.
        self.scratch_slot = num_slots if scratch_slots > 0 else None
        shape = (num_layers, num_slots + scratch_slots, num_kv_heads, head_dim)
        self.k = _zeros(shape, dtype, torch.device(device))  # (L, N, Hkv, D)
        self.v = _zeros(shape, dtype, torch.device(device))  # (L, N, Hkv, D)
        # Per-layer views, made once: `k[layer]` is a tensor op each time it is evaluated.
        self.k_layers = list(self.k.unbind(0))  # L x (N, Hkv, D)
        self.v_layers = list(self.v.unbind(0))
        # Prompt logprobs beside the K/V, by slot (logprob_store.py): what echo requests reuse.
        self.logprobs = LogprobStore(num_slots, _zeros)
        # NOTE: the free slots are a stack (alloc pops from the end): bottom to top, the slots
        # never handed out, num_slots - 1 down to `_next`, then `_free`, the ones given back. The
        # never-used part is kept as the bound `_next` (no list of num_slots ints), and it is
        # popped lowest first, so fresh slots walk the tensors from the start. `_is_free[s]`
        # mirrors membership so that a double free or a stray id is caught in O(n) of the freed
        # ids, without a scan.
        self._next = 0
        self._free: list[int] = []
        self._is_free = bytearray(b"\x01") * num_slots

    @property
    def device(self) -> torch.device:
        """Device of the KV tensors."""
        return self.k.device

    @property
    def num_free(self) -> int:
        """Number of slots currently free."""
        return len(self._free) + self.num_slots - self._next

    @property
    def committed_on_use(self) -> bool:
        """Whether `k` and `v` take memory only as their pages are first written (CPU)."""
        return self.k.device.type == "cpu" and _LAZY_ZEROS

    @property
    def nbytes(self) -> int:
        """Bytes held by `k` and `v` together."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    @property
    def side_nbytes(self) -> int:
        """Bytes held beside the K/V: the per-slot prompt logprobs (logprob_store.py)."""
        return self.logprobs.nbytes

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` distinct free slots: an int64 CPU tensor (n,), or None if fewer are free.

        When None is returned nothing has been allocated. `alloc(0)` returns an empty tensor.
        """
        if n < 0:
            raise ValueError(f"KVPool.alloc: expected n >= 0, got {n}")
        if n > self.num_free:
            return None
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        reused = min(n, len(self._free))
        fresh = n - reused  # from below the given-back slots: _next + fresh - 1 down to _next
        kept = len(self._free) - reused
        ids = list(range(self._next + fresh - 1, self._next - 1, -1)) + self._free[kept:]
        del self._free[kept:]
        self._next += fresh
        for s in ids:
            self._is_free[s] = 0
        return torch.tensor(ids, dtype=torch.int64)

    def free(self, slots: torch.Tensor | Sequence[int]) -> None:
        """Return `slots` to the free list.

        Raises ValueError (and frees nothing) on an id out of range, an id that is already
        free, or an id repeated within `slots`. Cost is O(len(slots)).
        """
        ids = slots.tolist() if isinstance(slots, torch.Tensor) else [int(s) for s in slots]
        if not ids:
            return
        n = self.num_slots
        bad = [s for s in ids if not 0 <= s < n]
        if bad:
            raise ValueError(f"KVPool.free: expected slot ids in [0, {n}), got {bad[:8]}")
        if len(set(ids)) != len(ids):
            raise ValueError("KVPool.free: expected distinct slot ids, got repeats")
        already = [s for s in ids if self._is_free[s]]
        if already:
            raise ValueError(f"KVPool.free: slots already free (double free): {already[:8]}")
        for s in ids:
            self._is_free[s] = 1
        self._free.extend(ids)
        # NOTE: a freed slot's logprob entry goes with it (evicted with the node that held it).
        self.logprobs.forget(ids)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's KV rows: `k`, `v` (T, Hkv, D) go to slots (T,) of layer `layer`."""
        expected = (slots.shape[0], self.num_kv_heads, self.head_dim)
        if slots.dim() != 1 or tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(
                f"KVPool.write: expected slots (T,) and k, v {expected}, "
                f"got slots {tuple(slots.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        # Casts only where needed: the model calls this once per layer per step.
        if slots.device != self.k.device or slots.dtype != torch.int64:
            slots = slots.to(device=self.k.device, dtype=torch.int64)
        # k and v may differ: the int path's v comes straight from the bf16 kernel output.
        if k.dtype != self.k.dtype:
            k = k.to(self.k.dtype)
        if v.dtype != self.v.dtype:
            v = v.to(self.v.dtype)
        self.k_layers[layer].index_copy_(0, slots, k)  # (N, Hkv, D)[slots] = (T, Hkv, D)
        self.v_layers[layer].index_copy_(0, slots, v)

    def write_all_layers(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store every layer's KV rows at once: `k`, `v` (L, T, Hkv, D) go to slots (T,)."""
        expected = (self.num_layers, slots.shape[0], self.num_kv_heads, self.head_dim)
        if slots.dim() != 1 or tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(
                f"KVPool.write_all_layers: expected slots (T,) and k, v {expected}, "
                f"got slots {tuple(slots.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        slots = slots.to(device=self.k.device, dtype=torch.int64)
        self.k.index_copy_(1, slots, k.to(self.k.dtype))  # (L, N, Hkv, D)[:, slots] = k
        self.v.index_copy_(1, slots, v.to(self.v.dtype))

    def free_slot_ids(self) -> torch.Tensor:
        """A copy of the free list as an int64 CPU tensor (for integrity checks)."""
        never_used = torch.arange(self.num_slots - 1, self._next - 1, -1, dtype=torch.int64)
        return torch.cat([never_used, torch.tensor(self._free, dtype=torch.int64)])


# Private anonymous mappings (Linux, macOS) are zero-filled by the kernel on first touch.
_LAZY_ZEROS = hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor of `shape`; on CPU one whose pages the kernel backs on first write.

    Reads of a page never written see the kernel's shared zero page, so unwritten slots read as
    zeros (the padded keys attention gathers and masks must not be NaN) at no memory cost.
    """
    if device.type != "cpu" or not _LAZY_ZEROS:
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)  # > 0: KVPool checks every dimension
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    buf = mmap.mmap(-1, count * dtype.itemsize, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    # The tensor holds the mapping: it is unmapped when the last view of it goes.
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)


def check_slot_accounting(pool: KVPool, cache: RadixCache, in_use: Sequence[torch.Tensor]) -> None:
    """Asserts every slot is in exactly one of: free, held by the tree, held by a running request;
    free + cached + in_use == total.

    `in_use` holds the slots each running request owns (not the ones it borrows from the tree
    through a locked prefix). Raises AssertionError naming leaked and multiply-held slots.
    """
    groups = {
        "free": pool.free_slot_ids(),
        "tree": cache.all_slot_ids(),
        "in_use": torch.cat([t.reshape(-1).to("cpu", torch.int64) for t in in_use])
        if in_use
        else torch.empty(0, dtype=torch.int64),
    }
    n = pool.num_slots
    for name, ids in groups.items():
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise AssertionError(f"slot accounting: {name} holds ids outside [0, {n})")
    counts = torch.bincount(torch.cat(list(groups.values())), minlength=n)
    leaked = torch.nonzero(counts == 0).flatten().tolist()
    shared = torch.nonzero(counts > 1).flatten().tolist()
    if leaked or shared:
        owners = {s: [g for g, ids in groups.items() if bool((ids == s).any())] for s in shared}
        raise AssertionError(
            f"slot accounting: {len(leaked)} leaked (no owner) {leaked[:8]}, "
            f"{len(shared)} held more than once {dict(list(owners.items())[:8])}; "
            + ", ".join(f"{g}={ids.numel()}" for g, ids in groups.items())
            + f", total={n}"
        )

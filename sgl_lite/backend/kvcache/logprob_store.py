"""Per-slot prompt logprobs kept beside the K/V: what lets the radix cache serve echo requests.

The logprob of token t_i given t_0..t_{i-1} (and the top entries of that position's
distribution) is a function of the prefix t_0..t_i only, as t_i's K/V is, so it can live in the
slot that holds t_i's K/V and be shared through the tree exactly as the K/V is: the tree keeps
slot ids, this store keeps numbers indexed by them. A slot's entry is written when a pass
computes the logits of the position before it (a prompt-logprob request), and is unknown
otherwise (most slots: a plain prefill computes only its last row).

    known[s]      uint8 (N,): 1 when the entries of slot s are valid, 0 when never computed
    logprob[s]    float32 (N,): log p(token in s | the tokens before it)
    top_values[s] float32 (N, TOP_K): the position's TOP_K largest logprobs, descending
    top_ids[s]    int32 (N, TOP_K): their token ids

NOTE: entries are per slot, so they are evicted with the slot: `KVPool.free` calls `forget`,
and a slot handed out again starts unknown. Nothing here knows about requests or the tree.
The tensors stay on the CPU whatever the pool's device (the numbers come from and go to
Python lists), and on CPU their pages are committed only as slots are first written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

TOP_K = 5  # top entries kept per slot; a request that asks for more recomputes its prompt
# float32 logprob + uint8 flag + TOP_K x (float32 value + int32 id)
BYTES_PER_SLOT = 4 + 1 + TOP_K * (4 + 4)

ZerosFn = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


class StoredLogprobs(NamedTuple):
    """Entries read back for some slots: one logprob and TOP_K (value, id) pairs per slot."""

    chosen: list[float]
    top: list[list[tuple[float, int]]]


class LogprobStore:
    """Slot-indexed prompt logprobs and their top TOP_K entries, with an unknown flag."""

    def __init__(self, num_slots: int, zeros: ZerosFn) -> None:
        cpu = torch.device("cpu")
        self.num_slots = num_slots
        self.known = zeros((num_slots,), torch.uint8, cpu)  # (N,)
        self.logprob = zeros((num_slots,), torch.float32, cpu)  # (N,)
        self.top_values = zeros((num_slots, TOP_K), torch.float32, cpu)  # (N, K)
        self.top_ids = zeros((num_slots, TOP_K), torch.int32, cpu)  # (N, K)

    @property
    def nbytes(self) -> int:
        """Bytes the four tensors take (reserved; on CPU committed as slots are written)."""
        return self.num_slots * BYTES_PER_SLOT

    def write(
        self,
        slots: torch.Tensor,
        chosen: Sequence[float],
        top: Sequence[Sequence[tuple[float, int]]],
    ) -> None:
        """Stores one entry per slot of `slots` (T,): `chosen` (T,) and at least TOP_K
        (value, id) pairs per slot, descending (extra pairs are dropped)."""
        if len(chosen) != slots.shape[0] or len(top) != slots.shape[0]:
            raise ValueError(
                f"LogprobStore.write: expected {slots.shape[0]} values and top lists, "
                f"got {len(chosen)} and {len(top)}"
            )
        if not len(chosen):
            return
        if any(len(row) < TOP_K for row in top):
            raise ValueError(f"LogprobStore.write: expected >= {TOP_K} top entries per slot")
        idx = slots.to("cpu", torch.int64)
        self.logprob[idx] = torch.tensor(chosen, dtype=torch.float32)
        self.top_values[idx] = torch.tensor([[v for v, _ in row[:TOP_K]] for row in top])
        self.top_ids[idx] = torch.tensor([[t for _, t in row[:TOP_K]] for row in top]).int()
        self.known[idx] = 1

    def read(self, slots: torch.Tensor) -> StoredLogprobs:
        """The entries of `slots` (T,), all of which must be known (`known_prefix` says so)."""
        idx = slots.to("cpu", torch.int64)
        assert bool(self.known[idx].all()), "LogprobStore.read: a slot's entry is unknown"
        values, ids = self.top_values[idx].tolist(), self.top_ids[idx].tolist()
        return StoredLogprobs(
            self.logprob[idx].tolist(), [list(zip(v, t)) for v, t in zip(values, ids)]
        )

    def known_prefix(self, slots: torch.Tensor) -> int:
        """How many leading slots of `slots` (T,) hold known entries."""
        if not slots.numel():
            return 0
        unknown = torch.nonzero(self.known[slots.to("cpu", torch.int64)] == 0)
        return int(unknown[0, 0]) if unknown.numel() else int(slots.shape[0])

    def copy_known(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Where `src[i]` is known and `dst[i]` is not, copies the entry over (a request's
        duplicate slots, about to be freed, into the tree's slots for the same tokens)."""
        if not src.numel():
            return
        src, dst = src.to("cpu", torch.int64), dst.to("cpu", torch.int64)
        move = (self.known[src] == 1) & (self.known[dst] == 0)
        if not bool(move.any()):
            return
        s, d = src[move], dst[move]
        self.logprob[d] = self.logprob[s]
        self.top_values[d] = self.top_values[s]
        self.top_ids[d] = self.top_ids[s]
        self.known[d] = 1

    def forget(self, slots: torch.Tensor | Sequence[int]) -> None:
        """Marks `slots` unknown (they were freed: their next owner computes its own)."""
        idx = torch.as_tensor(slots, dtype=torch.int64)
        if idx.numel():
            self.known[idx] = 0

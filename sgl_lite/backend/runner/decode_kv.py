"""The running decode batch's K/V, kept gathered between steps instead of re-gathered per layer.

Attention reads each request's whole K/V, scattered over pool slots. Gathering it costs a copy of
the whole prefix per layer per step; in a run of decode steps over the same requests only one
new row per request changes. `DecodeKV` keeps, per layer, a (B, Hkv, capacity, D) copy of the
batch's K/V, the layout attention reads fastest (SDPA over it: 1.14 ms against 1.76 ms for the
same K/V as a transposed (B, capacity, Hkv, D) view, 8 rows of 900 positions): a step that
extends exactly the previous step's rows by one token appends that token's K/V
(the values the layer has just written to the pool); so does the onnxruntime step's pass of one
request's several tokens (`plan(extend=True)`); any other pass starts a fresh copy. The
pool stays the only owner of KV data; this is a cache of reads, exact by construction (a slot's
K/V never changes while the request that owns it runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.types import Segment

# The copies of all layers together. 16 rows of 256 positions in float64 (the int modes) take
# 377 MB for SmolLM2; below that, a 16-prompt decode re-gathered and re-cast the whole prefix
# of every layer each step (8 % of the step, measured).
MAX_BYTES = 512 << 20
ROUND = 64  # capacity grows in steps of this many positions (a fresh gather each time)


@dataclass(frozen=True)
class KVView:
    """This pass's use of the copies: `fresh` fills positions [0, start) of each row from the
    pool, else the copies already hold them; the pass's new tokens go at `new_index`: for row
    b, position p and KV head h the flat position (b * Hkv + h) * capacity + p of the copy seen
    as (B * Hkv * capacity, D), in the order of the pass's tokens, then heads."""

    k: list[torch.Tensor]  # per layer (B, Hkv, capacity, D): views of k_all
    v: list[torch.Tensor]
    capacity: int
    fresh: bool
    new_index: torch.Tensor  # (T * Hkv,) for the pass's T new tokens
    # All layers' copies in one (L, B, Hkv, capacity, D) tensor (the onnxruntime step binds it)
    k_all: torch.Tensor
    v_all: torch.Tensor


class DecodeKV:
    """Gathered K/V copies of the last decode batch (see the module doc)."""

    def __init__(
        self, pool: KVPool, dtype: torch.dtype | None = None, max_bytes: int | None = MAX_BYTES
    ) -> None:
        self.pool = pool
        # None: no bound (where the copies are the only path attention has: every pass on the
        # onnxruntime graph); else a batch whose copies would take more is refused.
        self.max_bytes = max_bytes
        # The copies are kept in the dtype attention computes in (float64 in the int modes), so
        # a step converts only its new rows, not the whole prefix per layer.
        self.dtype = dtype or pool.k.dtype
        self._rows: list[torch.Tensor] | None = None  # previous step's kv_slots per request
        self._k_all = self._v_all = torch.empty(0)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._shape: tuple[int, int] = (0, 0)

    def reset(self) -> None:
        """Forgets the copies' contents (the next decode step gathers afresh)."""
        self._rows = None

    @property
    def nbytes(self) -> int:
        """Bytes the copies hold now."""
        return 2 * self._k_all.numel() * self._k_all.element_size()

    def release(self) -> None:
        """Frees the copies (the next pass allocates and gathers afresh)."""
        self.reset()
        self._k_all = self._v_all = torch.empty(0)
        self._k, self._v = [], []
        self._shape = (0, 0)

    def plan(self, segments: list[Segment], extend: bool = False) -> KVView | None:
        """The view for a pass of single-token decodes, or None (and a reset) for any other.
        With `extend` (the onnxruntime step's passes) one request may also bring several
        tokens (a jump-forward chunk, the next step of a program): its copy keeps its prefix."""
        batch = len(segments)
        single = all(len(s.token_ids) == 1 for s in segments)
        if not (single or (extend and batch == 1)):
            self.reset()
            return None
        need = -(-max(s.end for s in segments) // ROUND) * ROUND
        # A batch of the size of the last keeps its copies' capacity where that holds this
        # batch and is no more than twice what it needs (no new copies); else the copies are
        # sized to this batch, so one long prompt's copies do not size every later batch's
        # (16 rows after a 512-token prompt held 512 MB of copies for 192 positions).
        same_size = batch == self._shape[0] and need <= self._shape[1] <= 2 * need
        capacity = self._shape[1] if same_size else need
        pool = self.pool
        row_bytes = pool.num_kv_heads * pool.head_dim * self.dtype.itemsize
        limit = self.max_bytes
        if limit is not None and 2 * pool.num_layers * batch * capacity * row_bytes > limit:
            self.reset()
            return None
        prev = self._rows
        # Fresh unless each row continues the previous pass's row with nothing in between.
        fresh = (
            prev is None
            or len(prev) != batch
            or (batch, capacity) != self._shape
            or not all(
                s.start == len(p) and torch.equal(s.kv_slots[: s.start], p)
                for s, p in zip(segments, prev)
            )
        )
        heads = pool.num_kv_heads
        if (batch, capacity) != self._shape:
            self.release()  # the old copies go before the new ones are made (the peak)
            shape = (pool.num_layers, batch, heads, capacity, pool.head_dim)
            self._k_all = torch.zeros(shape, dtype=self.dtype, device=pool.device)
            self._v_all = torch.zeros(shape, dtype=self.dtype, device=pool.device)
            self._k, self._v = list(self._k_all.unbind(0)), list(self._v_all.unbind(0))
            self._shape = (batch, capacity)
        self._rows = [s.kv_slots for s in segments]
        # Row-major over the pass's tokens, then KV heads: (T * Hkv,) for T new tokens.
        new_index = torch.tensor(
            [
                (b * heads + h) * capacity + position
                for b, s in enumerate(segments)
                for position in range(s.start, s.end)
                for h in range(heads)
            ]
        )
        return KVView(
            self._k, self._v, capacity, fresh, new_index.to(pool.device), self._k_all, self._v_all
        )

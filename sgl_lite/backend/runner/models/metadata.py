"""Where every token of a forward pass sits: the attention metadata the runner builds once per
pass and every layer of every model family reads. Models see these tensors, never requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgl_lite.backend.runner.decode_kv import KVView
from sgl_lite.backend.runner.models.shared_prefix import SharedPrefixes, additive


@dataclass(frozen=True, kw_only=True)
class AttentionGroup:
    """Requests whose queries are padded together for one attention call.

    B = requests in the group, Q = most new tokens of one of them, K = longest whole sequence
    (cached prefix + new tokens). Decodes (Q = 1) and prefill chunks form separate groups, so a
    long chunk never pads every decode row to its length.
    """

    q_index: torch.Tensor  # (B, Q) row of each query in the flat token matrix; padding → row 0
    q_flat: torch.Tensor  # (T_g,) row of each real query in the (B * Q) padded layout
    rows: torch.Tensor  # (T_g,) the same queries' rows in the flat token matrix
    kv_slots: torch.Tensor  # (B, K) pool slots of each request's whole sequence; padding → 0
    kv_flat: torch.Tensor  # (B * K,) the same, flattened for index_select
    # (B, 1, G * Q, K) True where the query may attend to the key, rows repeated for the G query
    # heads sharing a KV head; None when every query sees every key (one decode request)
    mask: torch.Tensor | None
    # The same for sliding-window layers (a query at p sees keys in (p - window, p]); None when
    # the model has no sliding layers or no key of the group falls out of the window
    window_mask: torch.Tensor | None = None
    rows_in_order: bool = False  # q_index is arange(B)[:, None]: queries need no gather
    # Every request's queries start its sequence (position 0, nothing cached) and no window cuts
    # a key: `mask` is then plain causal, which plain-softmax layers may leave to SDPA
    # (Attention._attend_causal); layers that compute otherwise read `mask` as always
    causal: bool = False
    kv_view: KVView | None = None  # decode steps: K/V kept gathered between steps (decode_kv)
    # Decode steps that attend over the copies' whole capacity (Attention._decode_over_copies):
    # (B, 1, 1, capacity) float32, 0 for each row's keys and -inf past them; else None
    capacity_bias: torch.Tensor | None = None
    # decode steps whose rows share cached prefixes: each prefix read once (shared_prefix)
    shared: SharedPrefixes | None = None
    # `additive_mask`'s conversions by dtype; not an init field, so `dataclasses.replace` (Gemma
    # swapping in its window mask) starts an empty one
    _additive: dict[torch.dtype, torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """`mask` as SDPA's additive form in `dtype` (0 where a query attends, -inf elsewhere),
        made once per pass and dtype and shared by every layer: given the boolean mask, SDPA
        converts it in every layer (a chunk pass of 8 x 40 queries over ~600 keys: 1.64 -> 1.28 ms
        of attention a layer, bf16, 2 threads). SDPA's outputs are equal bit for bit either way."""
        if self.mask is None:
            return None
        found = self._additive.get(dtype)
        if found is None:
            found = self._additive[dtype] = additive(self.mask, dtype)
        return found


@dataclass(frozen=True, kw_only=True)
class AttentionMetadata:
    """Where every token of a batch sits, built once per forward and shared by all layers.

    T = new tokens in the batch, flattened over all requests in order.
    """

    positions: torch.Tensor  # (T,) absolute position of each new token
    cos: torch.Tensor  # (T, 1, R) RoPE tables at those positions, looked up once for all layers
    sin: torch.Tensor  # (T, 1, R); R = rotated dims of a head (D unless partial rotary)
    out_slots: torch.Tensor  # (T,) pool slot that receives each new token's K/V
    groups: tuple[AttentionGroup, ...]
    use_int: bool = False  # small pass: linears run their packed int kernels where they have one

"""Dense bf16/fp16 weights kept in oneDNN's own blocked layout, for the dense GEMM.

`F.linear` on a CPU bf16 weight hands oneDNN a plain (out, in) matrix, which it reorders into
its blocked layout on every call. For the passes of few rows that decode batches bring, that
reorder is a large share of the product: every linear of SmolLM2-135M and its head, 16 rows,
2 threads on an AVX512-BF16 EPYC: 36.9 ms plain, 22.8 ms from weights reordered once (64 rows:
79.8 → 62.7 ms; from ~256 rows on the two are level). The product is the same kernel's, bit for
bit (`prepack` checks it on each weight's first rows before using it), and a row's result does
not depend on the rows beside it.

Only the dense copy changes layout: a prepacked weight is opaque (read it only through
`linear`), so the runner prepacks once every load-time use of the dense weights (int-kernel
packing, probes) is done.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The row count oneDNN is told to expect; measured level from 1 to 512 rows.
ROWS_HINT = 64
DTYPES = (torch.bfloat16, torch.float16)


def why_not(weight: torch.Tensor) -> str | None:
    """Why `weight` (out, in) cannot be prepacked here, or None if it can."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.numel() == 0:
        return "not a dense CPU matrix"
    return why_not_dtype(weight.dtype)


def why_not_dtype(dtype: torch.dtype) -> str | None:
    """Why CPU weights of `dtype` cannot be prepacked here, or None if they can."""
    if dtype not in DTYPES:
        return f"{dtype} (oneDNN's prepacked product is used for bf16/fp16 only)"
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    supported = {
        torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
        torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported,
    }[dtype]
    if not supported():
        return f"this CPU has no oneDNN {dtype} kernel"
    return None


# Whether the prepacked product equals `F.linear`'s, by (shape, dtype): oneDNN picks its kernel
# by shape and dtype, not by the values, so one probe per kind of weight answers for all of them
# (a model has ~5 kinds and ~120 weights; a probe costs about two reorders).
_SAME_PRODUCT: dict[tuple[tuple[int, ...], torch.dtype], bool] = {}


def prepack(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` (out, in) in oneDNN's blocked layout, or None where it cannot be used here
    (see `why_not`) or its product differs from `F.linear`'s on a probe row block (checked on
    the first weight of each shape and dtype)."""
    if why_not(weight) is not None:
        return None
    kind = (tuple(weight.shape), weight.dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        if kind not in _SAME_PRODUCT:
            probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
            probe = probe.to(weight.dtype)
            _SAME_PRODUCT[kind] = torch.equal(linear(probe, packed), F.linear(probe, weight))
    except RuntimeError:  # an op missing from this torch build
        return None
    return packed if _SAME_PRODUCT[kind] else None


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, in) @ weight^T + bias → (T, out), from `prepack`'s copy of the weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

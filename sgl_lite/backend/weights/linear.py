"""A linear layer with two paths over one set of weights: dense GEMM, or a packed int kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sgl_lite.backend.weights.quant import PackedWeight


class Linear(nn.Linear):
    """`nn.Linear` that may also hold a packed int copy of its weight for small passes.

    `run` is called directly by the model (not through `__call__`), which skips module hooks:
    at batch 1 the per-call overhead of ~200 linears per step is measurable.
    """

    packed: PackedWeight | None = None

    def run(self, x: torch.Tensor, use_int: bool) -> torch.Tensor:
        """x (T, in) → (T, out) in x's dtype; the int kernel when asked and present."""
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if use_int:
            out = self.packed.matmul(x.to(torch.bfloat16)).to(x.dtype)
            return out if self.bias is None else out + self.bias
        return dense_as_kernel(x, self.weight, self.bias)


def dense_as_kernel(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """A dense matmul that rounds like the int kernels: bf16 activations in, bf16 values out.

    The prefill of a token and its decode then differ in summation order only (see packing);
    the two casts cost little next to a prefill's GEMM.
    """
    if x.dtype == torch.bfloat16:
        return F.linear(x, weight, bias)
    out = F.linear(x.to(torch.bfloat16).to(x.dtype), weight).to(torch.bfloat16).to(x.dtype)
    return out if bias is None else out + bias

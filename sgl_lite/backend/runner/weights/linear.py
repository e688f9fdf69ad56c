"""The model's linear layer: a dense GEMM, or a packed int kernel once the runner installs one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sgl_lite.backend.runner.weights import onednn
from sgl_lite.backend.runner.weights.quant import PackedWeight

# Up to this many rows (decode batches, short chunks) `dense_linear` takes the transposed product.
FEW_ROWS = 64


def dense_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x (T, in) @ weight (out, in)^T + bias → (T, out), contiguous.

    On CPU in float32, for at most FEW_ROWS rows, this computes (weight @ x^T)^T: MKL's sgemm
    takes that shape through a faster kernel than `F.linear`'s x @ weight^T for few rows. A
    SmolLM2 decode step, A/B in one process on an AMD EPYC, 2 threads: 8 rows 146 → 126 ms,
    16 rows 177 → 140 ms, a 40-token prefill 204 → 170 ms; from ~128 rows on it is slower
    (300: 714 → 919 ms), so longer passes keep `F.linear`, as do other devices and dtypes.
    """
    few = x.dim() == 2 and x.shape[0] <= FEW_ROWS
    if not few or weight.device.type != "cpu" or weight.dtype is not torch.float32:
        return F.linear(x, weight, bias)
    xt = x.t()
    out = torch.mm(weight, xt) if bias is None else torch.addmm(bias.unsqueeze(1), weight, xt)
    return out.t().contiguous()


class Linear(nn.Linear):
    """`nn.Linear` whose weight may be replaced by a packed int copy (`packed`), and whose
    dense weight may be held in oneDNN's layout instead (`prepacked`, see `prepack_dense`).

    `run` is called directly by the model (not through `__call__`), which skips module hooks:
    at batch 1 the per-call overhead of ~200 linears per step is measurable.
    """

    packed: PackedWeight | None = None
    prepacked: torch.Tensor | None = None

    @property
    def has_dense(self) -> bool:
        """Whether passes off the int kernels can run (a dense weight, in either layout)."""
        return self.prepacked is not None or self.weight.numel() > 0

    def prepack_dense(self) -> bool:
        """Moves the dense weight into oneDNN's layout where that runs here (`onednn`); the
        plain copy is freed. Returns whether it moved."""
        packed = onednn.prepack(self.weight) if self.weight.numel() else None
        if packed is None:
            return False
        self.prepacked = packed
        self.drop_dense()
        return True

    def drop_dense(self) -> None:
        """Frees the plain dense weight (its codes or its oneDNN copy run instead). An empty
        (0, in) weight of the same dtype stays, so `.to(dtype)`, state listings and the
        activation dtype read from it keep working."""
        weight = self.weight
        device = None if weight.device.type == "meta" else weight.device  # meta: never loaded
        empty = torch.empty(0, self.in_features, dtype=weight.dtype, device=device)
        self.weight = nn.Parameter(empty, requires_grad=False)

    def run(self, x: torch.Tensor, use_int: bool, cast_back: bool = True) -> torch.Tensor:
        """x (T, in) → (T, out) in the model's activation dtype (its weights' dtype): the packed
        kernel when the pass asks for it, the dense GEMM otherwise.

        In the deterministic mode the dense weight is gone once a packed copy is installed (see
        packing), so every pass runs the kernel. The kernel takes its own input dtype (bf16 for
        torch's, float32 for onnxruntime's): that cast of the input is the one rounding the int
        path adds. `cast_back=False` leaves the kernel's output in its dtype, for a caller
        whose next op mixes it with an operand of the activation dtype: type promotion then
        widens it inside that op, to the same bits as a cast first, and a step saves one op
        per linear (~1 % at batch 1).
        """
        packed = self.packed
        if packed is None or not use_int:
            if self.prepacked is not None:
                return onednn.linear(x, self.prepacked, self.bias)
            if self.weight.numel() == 0:
                raise RuntimeError("a packed linear has no dense weight; run the pass with use_int")
            return dense_linear(x, self.weight, self.bias)
        kernel_dtype = packed.input_dtype
        out = packed.matmul(x if x.dtype is kernel_dtype else x.to(kernel_dtype))
        if self.bias is not None:
            out = out + self.bias  # the float bias promotes a bf16 sum
        return out if not cast_back or out.dtype is self.weight.dtype else out.to(self.weight.dtype)

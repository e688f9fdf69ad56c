"""onnxruntime's MatMulNBits kernel fed a GGUF-style group-affine matrix: the product equals the
file's dequantized matrix times x (up to the kernel's int8 activation rounding), for Q4_1's
float minimum (the integer zero point plus its exact remainder) and for Q8_0's signed codes."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.quant import GROUP, GroupAffine

# MLAS quantizes the activations to int8 per block of 32: ~0.5 % relative error, measured;
# a wrong zero point or a dropped remainder is off by tens of percent.
TOLERANCE = 0.02


def _q4_1(rows: int, cols: int, seed: int) -> GroupAffine:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.02 + 0.001
    # minimums on both sides of zero, some past what a 4-bit zero point can express
    offset = (torch.rand(rows, cols // GROUP, generator=gen) - 0.7) * 0.5
    return GroupAffine(q, scale, offset, bits=4)


def _q8_0(rows: int, cols: int, seed: int) -> GroupAffine:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (rows, cols), generator=gen, dtype=torch.int8)
    scale = torch.rand(rows, cols // GROUP, generator=gen) * 0.01 + 0.001
    return GroupAffine(q, scale, torch.zeros_like(scale), bits=8)


def _relative_error(weight: ort_nbits.OrtNBitsWeight, affine: GroupAffine, rows: int) -> float:
    x = torch.randn(rows, affine.q.shape[1], generator=torch.Generator().manual_seed(7))
    want = x.double() @ affine.dequantize().double().t()
    got = weight.matmul(x).double()
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("make", [_q4_1, _q8_0], ids=["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_matmulnbits_computes_the_files_matrix(make, rows):
    affine = make(48, 96, seed=rows)
    weight = ort_nbits.OrtNBitsWeight.from_affine(affine, threads=1)
    assert weight.shape == (48, 96) and weight.input_dtype is torch.float32
    assert _relative_error(weight, affine, rows) < TOLERANCE


def test_the_remainder_is_what_keeps_q4_1_exact():
    """Without the remainder term (the zero point rounded to an integer, nothing added) the
    product is visibly wrong: the test above would catch a dropped remainder."""
    affine = _q4_1(32, 64, seed=1)
    zero = (-affine.offset / affine.scale).round().clamp(0, 15)
    rounded = GroupAffine(affine.q, affine.scale, -zero * affine.scale, bits=4)
    weight = ort_nbits.OrtNBitsWeight.from_affine(rounded, threads=1)
    assert _relative_error(weight, affine, rows=4) > 5 * TOLERANCE


@pytest.mark.parametrize(
    ("cols", "bits", "message"), [(32, 2, "4- or 8-bit"), (40, 4, "multiple of 32")]
)
def test_codes_of_other_widths_and_shapes_are_refused_by_name(cols, bits, message):
    codes = GroupAffine(
        torch.zeros(16, cols, dtype=torch.uint8), torch.ones(16, 1), torch.zeros(16, 1), bits
    )
    with pytest.raises(ValueError, match=message):
        ort_nbits.OrtNBitsWeight.from_affine(codes, threads=1)

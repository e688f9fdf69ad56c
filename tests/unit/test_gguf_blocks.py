"""Every GGUF block format we decode gives codes, scales and offsets whose `dequantize()` is
bit for bit gguf-py's own `dequantize` of the same bytes (random blocks, so every code, sub-scale
and minimum pattern occurs); fused matrices of mixed formats stay exact; onnxruntime's kernel
computes the product of each, and a block whose scale is 0 gives its offset, not NaN."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from sgl_lite.backend.runner.weights import gguf_blocks, ort_nbits
from sgl_lite.backend.runner.weights.quant import GroupAffine, Int4Weight
from tests.support.gguf_files import HALF_FIELDS, random_block_bytes

WIDTH = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4}  # the rest are held as 8-bit codes
FINE = {"Q2_K", "Q3_K", "Q6_K"}  # groups of 16


def _type_id(kind: str) -> int:
    return int(gguf.GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", list(HALF_FIELDS))
def test_codes_times_scales_are_gguf_pys_dequantize_bit_for_bit(kind):
    rows, cols = 6, 512
    raw = random_block_bytes(kind, rows, cols, seed=len(kind))
    affine = gguf_blocks.decode(_type_id(kind), raw)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(rows, cols)
    assert affine.q.shape == (rows, cols)
    assert affine.bits == WIDTH.get(kind, 8)
    assert affine.group == (16 if kind in FINE else 32)
    assert torch.equal(affine.dequantize(), torch.from_numpy(np.ascontiguousarray(want)))


def test_a_fused_matrix_of_mixed_formats_is_each_part_exactly():
    """Q4_K_M's fused q/k/v: Q4_K q and k beside a Q6_K v, held as 8-bit codes in groups of 16."""
    parts = [
        gguf_blocks.decode(_type_id(kind), random_block_bytes(kind, 4, 256, seed))
        for seed, kind in enumerate(("Q4_K", "Q4_K", "Q6_K"))
    ]
    fused = GroupAffine.cat(parts)
    assert (fused.bits, fused.group) == (8, 16)
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_consecutive_row_slices_fuse_without_a_copy_and_others_are_copied():
    """The GGUF reader decodes a fused linear's parts together and hands out row views
    (`row_slice`): fusing them again is a view of the same storage; parts that are not
    consecutive rows of one matrix are copied, with the same values either way."""
    whole = gguf_blocks.decode(_type_id("Q4_K"), random_block_bytes("Q4_K", 12, 256, seed=3))
    parts = [whole.row_slice(0, 8), whole.row_slice(8, 10), whole.row_slice(10, 12)]
    fused = GroupAffine.cat(parts)
    for got, base in ((fused.q, whole.q), (fused.scale, whole.scale)):
        assert got.data_ptr() == base.data_ptr() and got.shape == base.shape
    assert torch.equal(fused.dequantize(), whole.dequantize())
    swapped = GroupAffine.cat([parts[1], parts[0]])  # not in storage order: a copy
    assert swapped.q.data_ptr() != whole.q.data_ptr()
    assert torch.equal(
        swapped.dequantize(), torch.cat([parts[1].dequantize(), parts[0].dequantize()])
    )


def test_the_int4_kernel_takes_only_4_bit_codes_in_groups_of_32():
    q6 = gguf_blocks.decode(_type_id("Q6_K"), random_block_bytes("Q6_K", 16, 256, 0))
    with pytest.raises(ValueError, match="groups of 32"):
        Int4Weight.from_affine(q6)
    q4 = gguf_blocks.decode(_type_id("Q4_K"), random_block_bytes("Q4_K", 16, 256, 0))
    packed = Int4Weight.from_affine(q4)  # Q4_K is Q4_1's shape: exact codes
    x = torch.randn(3, 256)
    want = x @ Int4Weight.kernel_matrix(q4).t()
    got = packed.matmul(x.to(torch.bfloat16)).float()
    assert (got - want).norm() / want.norm() < 0.02


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q3_K"])
def test_onnxruntime_computes_each_formats_product(kind):
    affine = gguf_blocks.decode(_type_id(kind), random_block_bytes(kind, 32, 512, 3))
    weight = ort_nbits.OrtNBitsWeight.from_affine(affine, threads=1)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7))
    want = x.double() @ affine.dequantize().double().t()
    got = weight.matmul(x).double()
    assert float((got - want).norm() / want.norm()) < 0.02


def test_a_block_whose_scale_is_zero_is_its_offset_not_nan():
    q = torch.randint(0, 16, (16, 64), dtype=torch.uint8)
    scale = torch.full((16, 2), 0.01)
    offset = torch.full((16, 2), -0.05)
    scale[3, 1] = 0.0  # an all-equal block, as quantizers write one
    affine = GroupAffine(q, scale, offset, bits=4)
    weight = ort_nbits.OrtNBitsWeight.from_affine(affine, threads=1)
    x = torch.randn(2, 64)
    got = weight.matmul(x)
    assert torch.isfinite(got).all()
    want = x @ affine.dequantize().t()
    assert float((got - want).norm() / want.norm()) < 0.02

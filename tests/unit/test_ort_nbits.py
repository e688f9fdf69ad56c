"""onnxruntime's MatMulNBits kernel fed a GGUF-style group-affine matrix: the product equals the
file's dequantized matrix times x (up to the kernel's int8 activation rounding), for Q4_1's
float minimum (the integer zero point plus its exact remainder) and for Q8_0's signed codes."""

from __future__ import annotations

import os

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


def _captured_models(monkeypatch) -> list[bytes]:
    """The serialized models handed to onnxruntime from here on (each session still made)."""
    import onnxruntime as ort

    models: list[bytes] = []
    real = ort.InferenceSession

    def record(model, *args, **kwargs):
        models.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", record)
    return models


@pytest.mark.parametrize("make", [_q4_1, _q8_0], ids=["q4_1", "q8_0"])
@pytest.mark.parametrize("in_shared_memory", [False, True], ids=["cache", "shm"])
def test_large_constants_reach_onnxruntime_through_files_and_leave_the_callers_hands(
    make, in_shared_memory, monkeypatch, tmp_path
):
    """Past FILE_BYTES the constants go through scratch files (under the cache dir, or in
    shared memory): the caller's dict keeps none of them (so ours are freed before onnxruntime
    packs its own), the model carries no raw weights, the files are gone once the session
    exists, and the product is the file's matrix still."""
    monkeypatch.setattr(ort_nbits, "FILE_BYTES", 0)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(ort_nbits, "SHARED_MEMORY", shm if in_shared_memory else tmp_path / "none")
    monkeypatch.setenv("SGL_LITE_CACHE", str(tmp_path))
    made = []
    real_folder = ort_nbits.tempfile.TemporaryDirectory
    monkeypatch.setattr(
        ort_nbits.tempfile,
        "TemporaryDirectory",
        lambda **kw: made.append(kw["dir"]) or real_folder(**kw),
    )
    models = _captured_models(monkeypatch)
    affine = make(64, 256, seed=3)
    nodes, consts = ort_nbits.linear_nodes(affine, "A", "Y")
    large = {n for n, a in consts.items() if a.nbytes >= ort_nbits.EXTERNAL_BYTES}
    assert any(ort_nbits.prepacked(n) for n in large)
    session = ort_nbits.make_session(
        nodes,
        consts,
        [ort_nbits.onnx_proto.value_info("A", ort_nbits.onnx_proto.FLOAT, ["T", 256])],
        [ort_nbits.onnx_proto.value_info("Y", ort_nbits.onnx_proto.FLOAT, ["T", 64])],
        threads=1,
    )
    assert not large & set(consts)
    assert len(models[0]) < ort_nbits.EXTERNAL_BYTES * 2  # headers and nodes, no weights
    assert made == [shm if in_shared_memory else tmp_path]
    assert not list(tmp_path.glob("ort-*")) and not list(shm.glob("ort-*"))
    weight = ort_nbits.OrtNBitsWeight(session, (64, 256), affine.bits)
    assert _relative_error(weight, affine, rows=3) < TOLERANCE


def test_constants_go_in_memory_where_no_scratch_file_can_be_written(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(ort_nbits, "FILE_BYTES", 0)
    monkeypatch.setattr(ort_nbits, "SHARED_MEMORY", tmp_path / "no-shared-memory")
    monkeypatch.setenv("SGL_LITE_CACHE", str(blocker))
    affine = _q4_1(64, 256, seed=4)
    weight = ort_nbits.OrtNBitsWeight.from_affine(affine, threads=1)
    assert _relative_error(weight, affine, rows=2) < TOLERANCE


def test_scratch_files_go_to_shared_memory_where_it_has_room_else_to_the_cache(
    monkeypatch, tmp_path
):
    shm, cache = tmp_path / "shm", tmp_path / "cache"
    shm.mkdir()
    monkeypatch.setattr(ort_nbits, "SHARED_MEMORY", shm)
    monkeypatch.setenv("SGL_LITE_CACHE", str(cache))
    assert ort_nbits._scratch_root(1 << 20) == shm
    assert ort_nbits._scratch_root(1 << 62) == cache  # more than it could hold
    monkeypatch.setattr(ort_nbits, "SHARED_MEMORY", tmp_path / "absent")
    assert ort_nbits._scratch_root(1 << 20) == cache


def test_a_dead_loads_scratch_folder_is_swept_and_a_live_ones_kept(monkeypatch, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    dead = tmp_path / f"ort-{done.stdout.strip()}-abc"
    live = tmp_path / f"ort-{os.getpid()}-def"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "packed.bin").write_bytes(b"x")
    monkeypatch.setattr(ort_nbits, "FILE_BYTES", 0)
    monkeypatch.setattr(ort_nbits, "SHARED_MEMORY", tmp_path / "no-shared-memory")
    monkeypatch.setenv("SGL_LITE_CACHE", str(tmp_path))
    ort_nbits.OrtNBitsWeight.from_affine(_q4_1(64, 256, seed=5), threads=1)
    assert not dead.exists() and live.exists()


def _q6_k_like(rows: int, cols: int, seed: int) -> GroupAffine:
    """8-bit codes in blocks of 16, as the loader holds Q6_K (`gguf_blocks`)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-32, 32, (rows, cols), generator=gen, dtype=torch.int8)
    scale = torch.rand(rows, cols // 16, generator=gen) * 0.01 + 0.001
    return GroupAffine(q, scale, torch.zeros_like(scale), bits=8, group=16)


def test_a_linear_fused_from_parts_of_two_formats_runs_each_format_on_its_own_kernel():
    """Q4_K_M's q/k/v: 4-bit q and k beside an 8-bit v (Q6_K). Fused, the matrix is held as
    8-bit codes in blocks of 16 (exact, for the kernels that take one matrix); the graph runs
    q and k on their own 4-bit codes and v on its 8-bit ones, and the product is the fused
    matrix's, in fewer bytes than the widened whole's."""
    from sgl_lite.backend.runner.ort_graph import Graph
    from sgl_lite.backend.runner.weights import onnx_proto

    q, k, v = _q4_1(32, 64, seed=1), _q4_1(16, 64, seed=2), _q6_k_like(16, 64, seed=3)
    fused = GroupAffine.cat([q, k, v])
    assert (fused.bits, fused.group) == (8, 16) and fused.parts == (q, k, v)
    runs = fused.format_runs()
    assert [(r.bits, r.group, r.q.shape[0]) for r in runs] == [(4, GROUP, 48), (8, 16, 16)]
    assert torch.equal(torch.cat([r.dequantize() for r in runs]), fused.dequantize())
    assert GroupAffine.cat([q, k]).format_runs()[0].parts == ()  # one format: one run

    graph = Graph()
    y = graph.linear(fused, "x", "qkv")
    codes = [a for name, a in graph.consts.items() if name.endswith(".B")]
    assert sorted(a.nbytes for a in codes) == [16 * 64, 48 * 64 // 2]  # not 64 x 64 bytes
    session = ort_nbits.make_session(
        graph.nodes,
        graph.consts,
        [onnx_proto.value_info("x", onnx_proto.FLOAT, ["T", 64])],
        [onnx_proto.value_info(y, onnx_proto.FLOAT, ["T", 64])],
        threads=1,
    )
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7))
    (got,) = session.run(None, {"x": x.numpy()})
    want = x.double() @ fused.dequantize().double().t()
    assert float((torch.from_numpy(got).double() - want).norm() / want.norm()) < TOLERANCE

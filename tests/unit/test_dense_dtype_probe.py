"""The fast mode's dense dtype on a CPU with bf16 instructions: bf16, unless decode runs on int
kernels and this CPU's float32 GEMM measured faster (`cpu.dense_gemm_probe`)."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.runner.weights import cpu, formats
from sgl_lite.backend.runner.weights.cpu import FLOAT32_MARGIN, CpuCaps, GemmProbe
from sgl_lite.backend.runner.weights.formats import resolve_dense_dtype, resolve_format

BF16_CPU = CpuCaps(isa="AVX512", avx512_bf16=True, amx=False)
AVX2_CPU = CpuCaps(isa="AVX2", avx512_bf16=False, amx=False)


def _probe_answers(monkeypatch: pytest.MonkeyPatch, probe: GemmProbe | None) -> list[int]:
    """Makes `dense_gemm_probe` answer `probe`; returns a list that counts its calls."""
    calls: list[int] = []

    def fake() -> GemmProbe | None:
        calls.append(1)
        return probe

    monkeypatch.setattr(formats, "dense_gemm_probe", fake)
    return calls


def test_float32_wins_only_past_the_margin():
    assert GemmProbe(bf16_ms=6.6, float32_ms=4.0).float32_wins  # 1.65x
    assert not GemmProbe(bf16_ms=4.0 * FLOAT32_MARGIN * 0.99, float32_ms=4.0).float32_wins
    assert not GemmProbe(bf16_ms=1.0, float32_ms=4.0).float32_wins  # AMX: bf16 4x faster
    assert "1.65x float32's time" in GemmProbe(bf16_ms=6.6, float32_ms=4.0).describe()


def test_a_prefill_only_gemm_takes_float32_where_its_gemm_measured_faster(monkeypatch):
    calls = _probe_answers(monkeypatch, GemmProbe(bf16_ms=6.6, float32_ms=4.0))
    dtype, why = resolve_dense_dtype("auto", "cpu", BF16_CPU, prefill_only=True)
    assert dtype is torch.float32 and "bf16 GEMM 1.65x float32's time here" in why
    # Dense-only weights decode on the dense GEMM, where bf16's half bytes win: no probe.
    calls.clear()
    assert resolve_dense_dtype("auto", "cpu", BF16_CPU)[0] is torch.bfloat16
    assert not calls


def test_bf16_stays_where_it_is_not_slower_or_cannot_be_timed(monkeypatch):
    _probe_answers(monkeypatch, GemmProbe(bf16_ms=1.0, float32_ms=4.0))
    assert resolve_dense_dtype("auto", "cpu", BF16_CPU, prefill_only=True)[0] is torch.bfloat16
    _probe_answers(monkeypatch, None)  # bf16 cannot be prepacked here
    assert resolve_dense_dtype("auto", "cpu", BF16_CPU, prefill_only=True)[0] is torch.bfloat16


def test_no_probe_where_the_answer_needs_none(monkeypatch):
    calls = _probe_answers(monkeypatch, GemmProbe(bf16_ms=6.6, float32_ms=4.0))
    assert resolve_dense_dtype("auto", "cpu", AVX2_CPU, prefill_only=True)[0] is torch.float32
    assert resolve_dense_dtype("bfloat16", "cpu", BF16_CPU, prefill_only=True)[0] is torch.bfloat16
    assert resolve_dense_dtype("auto", "cuda", None, prefill_only=True)[0] is torch.bfloat16
    assert not calls


def test_the_fast_modes_int_format_follows_the_probe_and_dense_only_does_not(monkeypatch):
    _probe_answers(monkeypatch, GemmProbe(bf16_ms=6.6, float32_ms=4.0))

    def fmt(file_kind: str | None, **kw: object) -> formats.WeightFormat:
        args = dict(dtype="auto", quantization="auto", device="cpu", caps=BF16_CPU)
        return resolve_format(**{**args, **kw}, file_kind=file_kind)  # type: ignore[arg-type]

    fast = fmt("int4")
    assert (fast.dense_dtype, fast.int_kind) == (torch.float32, "int4")
    assert "float32's time here" in fast.describe()
    assert fmt(None).dense_dtype is torch.bfloat16  # a float checkpoint: dense-only
    assert fmt("int4", dtype="bfloat16").dense_dtype is torch.bfloat16  # asked for
    assert fmt("int4", quantization="none").dense_dtype is torch.bfloat16


def test_the_probe_runs_once_per_process_and_times_both_dtypes():
    cpu.dense_gemm_probe.cache_clear()
    try:
        first = cpu.dense_gemm_probe()
        assert cpu.dense_gemm_probe() is first
    finally:
        cpu.dense_gemm_probe.cache_clear()
    if first is not None:  # None: this torch cannot prepack bf16
        assert first.bf16_ms > 0 and first.float32_ms > 0


def test_every_pass_on_the_files_codes_has_no_gemm_to_time(monkeypatch):
    calls = _probe_answers(monkeypatch, GemmProbe(bf16_ms=6.6, float32_ms=4.0))
    fmt = resolve_format(
        dtype="auto",
        quantization="auto",
        device="cpu",
        caps=BF16_CPU,
        file_kind="int4",
        dense_copy=False,
    )
    assert fmt.dense_dtype is torch.bfloat16 and not calls

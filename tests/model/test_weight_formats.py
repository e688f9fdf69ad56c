"""Weight formats: GGUF blocks decoded as gguf-py does, packed kernels equal their dense matrices,
the int path of a tiny model gives the same bits in every pass shape, and impossible requests
are clear errors. (The embedded file read exactly: tests/tokenizer/test_embedded_weights.py;
its modes against float32: tests/e2e/test_smollm_logits.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.llama import LlamaForCausalLM
from sgl_lite.backend.runner.weights import gguf_blocks, quant
from sgl_lite.backend.runner.weights.cpu import cpu_caps
from sgl_lite.backend.runner.weights.formats import resolve_format
from sgl_lite.backend.runner.weights.packing import pack_model
from tests.support.runner_logits import chunked_logits
from tests.support.tiny import TINY_LLAMA


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_gguf_blocks_decode_as_the_gguf_package_dequantizes_them(kind):
    """Blocks gguf-py's own quantizer wrote from float weights (every other type: random blocks
    in tests/unit/test_gguf_blocks.py)."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(16, 128)).astype(np.float32)
    raw = quants.quantize(weight, GGMLQuantizationType[kind])
    ours = gguf_blocks.decode(int(GGMLQuantizationType[kind]), raw).dequantize()
    theirs = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]))
    assert torch.equal(ours, theirs.float())


def test_int4_kernel_multiplies_by_its_kernel_matrix_and_stays_near_the_file():
    torch.manual_seed(0)
    weight = torch.randn(64, 96) * 0.05
    affine = quant.affine_int4(weight)
    packed = quant.Int4Weight.from_affine(affine)
    matrix = quant.Int4Weight.kernel_matrix(affine)
    x = torch.randn(5, 96).bfloat16()
    out = packed.matmul(x).float()
    expected = x.float() @ matrix.t()
    assert (out - expected).abs().max() <= 0.01 * expected.abs().max()  # bf16 output rounding
    # only the bf16 rounding of scale and zero separates the kernel's matrix from the codes'
    step = affine.scale.max().item()
    assert (matrix - affine.dequantize()).abs().max() <= step * 8 / 128


@pytest.mark.parametrize("rows", [16, 592, 1040])  # one 16-row tail, past one and four chunks
def test_int4_packing_in_row_chunks_gives_the_whole_matrixs_bytes(rows):
    """Int4Weight packs 256 rows at a time (quant._PACK_ROWS); the kernel's layout is row-blocked,
    so the bytes equal one call's over the whole matrix, whatever tail the rows leave."""
    codes = torch.randint(0, 16, (rows, 96), generator=torch.Generator().manual_seed(rows))
    affine = quant.GroupAffine(
        codes.to(torch.uint8), torch.rand(rows, 3) + 0.01, torch.randn(rows, 3), 4, quant.GROUP
    )
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    assert torch.equal(quant.Int4Weight.from_affine(affine).packed, whole)


def test_int8_weight_is_per_row_round_to_nearest():
    torch.manual_seed(0)
    weight = torch.randn(32, 64)
    packed = quant.Int8Weight.from_float(weight)
    row_step = weight.abs().amax(1, keepdim=True) / 127
    assert ((packed.dequantize() - weight).abs() <= row_step * 0.51).all()
    x = torch.randn(3, 64).bfloat16()
    expected = x.float() @ packed.dequantize().t()
    assert (packed.matmul(x).float() - expected).abs().max() <= 0.01 * expected.abs().max()


def test_shapes_the_kernels_cannot_take_are_named_errors():
    with pytest.raises(ValueError, match="int4.*in_features=48"):
        quant.check_shape("int4", 64, 48, "layer 0 down")
    with pytest.raises(ValueError, match="out_features=100"):
        quant.check_shape("int4", 100, 64)
    with pytest.raises(ValueError, match="int8.*in_features=31"):
        quant.check_shape("int8", 16, 31)  # the kernel would read out of bounds here


def test_bad_dtype_and_quantization_values_name_the_field():
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="float64")
    with pytest.raises(ValueError, match="CPU kernels only"):
        resolve_format(
            dtype="auto", quantization="int4", device="cuda", caps=None, file_kind="int4"
        )


def test_a_cuda_device_always_gets_an_index_and_a_missing_one_is_named(monkeypatch):
    """`torch.cuda.set_device`, which each loop thread calls, refuses a bare "cuda"."""
    from sgl_lite.backend.runner import model_runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert model_runner._checked_device("cuda") == torch.device("cuda", 1)
    assert model_runner._checked_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="2 CUDA device.*cuda:0 to cuda:1"):
        model_runner._checked_device("cuda:2")
    assert model_runner._checked_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rope_tables_stay_exact_float32_whatever_the_weight_dtype(tiny_llama_folder, dtype):
    from sgl_lite.backend.runner.models.rope import RotaryEmbedding

    runner = ModelRunner(tiny_llama_folder, EngineConfig(dtype=dtype, max_total_tokens=64))
    assert runner.model.embed_tokens.weight.dtype == getattr(torch, dtype)
    rope, config = runner.model.rope, runner.hf_config
    exact = RotaryEmbedding(config, head_dim_of(config), runner.context_length)
    assert rope.cos.dtype == rope.sin.dtype == torch.float32
    assert torch.equal(rope.cos, exact.cos) and torch.equal(rope.sin, exact.sin)


def test_auto_picks_dense_bf16_only_where_the_cpu_has_a_bf16_gemm():
    caps = cpu_caps()
    fmt = resolve_format(dtype="auto", quantization="none", device="cpu", caps=caps, file_kind=None)
    assert fmt.dense_dtype == (torch.bfloat16 if caps.fast_bf16 else torch.float32)
    assert fmt.int_kind is None
    fmt = resolve_format(dtype="auto", quantization="auto", device="cpu", caps=caps, file_kind=None)
    assert fmt.int_kind is None  # a float checkpoint is never quantized by `auto`
    fmt = resolve_format(
        dtype="auto", quantization="auto", device="cpu", caps=caps, file_kind="int4"
    )
    # a quantized file, fast mode: its kernels for short passes, the dense GEMM for long ones
    assert (fmt.int_kind, fmt.attn_dtype, fmt.deterministic) == ("int4", None, False)
    assert fmt.runs_int(1) and not fmt.runs_int(4096)
    fmt = resolve_format(
        dtype="auto",
        quantization="auto",
        device="cpu",
        caps=caps,
        file_kind="int4",
        deterministic=True,
    )
    # deterministic: its kernels for every pass, float32 between them, float64 attention
    assert (fmt.int_kind, fmt.dense_dtype, fmt.attn_dtype) == ("int4", torch.float32, torch.float64)
    assert fmt.runs_int(1) and fmt.runs_int(4096)
    # a float checkpoint in the deterministic mode runs float64 (the float32 GEMM is not
    # row-invariant), and the settings that cannot keep the guarantee are refused by name
    fmt = resolve_format(
        dtype="auto",
        quantization="auto",
        device="cpu",
        caps=caps,
        file_kind=None,
        deterministic=True,
    )
    assert (fmt.int_kind, fmt.dense_dtype) == (None, torch.float64)
    refused = [
        ("bfloat16", "cpu", caps, "dtype=bfloat16"),
        ("auto", "cuda", None, "CPU kernels only"),
    ]
    for dtype, device, device_caps, message in refused:
        with pytest.raises(ValueError, match=message):
            resolve_format(
                dtype=dtype,
                quantization="auto",
                device=device,
                caps=device_caps,
                file_kind=None,
                deterministic=True,
            )


class _TinyRunner:
    """A random tiny Llama in float32 and packed `kind`, driven like the engine drives it."""

    CONFIG = LlamaConfig(**{**TINY_LLAMA, "vocab_size": 256, "tie_word_embeddings": True})

    def __init__(self, kind: str | None) -> None:
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(self.CONFIG).eval()
        model = LlamaForCausalLM(self.CONFIG, 128)
        model.load_hf_state_dict(hf.state_dict())
        int_kind = None
        if kind is not None:
            pack_model(model, kind, {}).install(model, keep_dense=False)
            int_kind = kind
        runner = ModelRunner.__new__(ModelRunner)
        runner.model, runner.device = model, torch.device("cpu")
        runner.pool = KVPool(
            num_layers=2, num_slots=256, num_kv_heads=2, head_dim=head_dim_of(self.CONFIG)
        )
        runner.format = resolve_format(
            dtype="float32",
            quantization=kind or "none",
            device="cpu",
            caps=None,
            file_kind=None,
            deterministic=kind is not None,
        )
        assert runner.format.int_kind == int_kind
        for layer in model.layers:
            layer.self_attn.attn_dtype = runner.format.attn_dtype
        self.runner = runner


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_tiny_model_int_path_gives_the_same_bits_in_every_pass_shape_and_stays_near_float(kind):
    """One prefill, decode steps and uneven chunks compute the very same logits (the int
    kernels run every pass, attention in float64), near the float32 model's."""
    tiny = _TinyRunner(kind)
    ids = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(3)).tolist()
    whole = chunked_logits(tiny.runner, ids, chunk=48)
    for chunk in (1, 5, 17):
        assert torch.equal(chunked_logits(tiny.runner, ids, chunk), whole), f"chunk {chunk}"
    dense = chunked_logits(_TinyRunner(None).runner, ids, chunk=48)
    assert (dense - whole).abs().max() <= 0.05 * dense.abs().max()
    assert (dense.argmax(-1) == whole.argmax(-1)).float().mean() >= 0.95

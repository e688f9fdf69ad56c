"""`FileCodes`: a GGUF file's quantized linears decoded when read, not at once, so a codes-only
load never holds every linear's codes; the same codes `read_quantized` decodes, formats known
without decoding, a fused linear's parts decoded once, deleted names forgotten."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from sgl_lite.backend.runner.model_loader import load_config, resolve_model_path
from sgl_lite.backend.runner.weights.gguf_tensors import FileCodes, read_quantized
from sgl_lite.backend.runner.weights.packing import exact_codes
from tests.support.gguf_files import tiny_model, write_gguf

pytestmark = pytest.mark.usefixtures("private_cache")

# A Q4_K_M-like file: Q4_K beside Q6_K, so q/k/v mix formats (4-bit/32 and 8-bit/16 codes)
MIXED = {p: "Q4_K" for p in ("q_proj", "k_proj", "o_proj", "gate_proj", "up_proj")}
MIXED.update(v_proj="Q6_K", down_proj="Q6_K")


@pytest.fixture
def mixed_file(tmp_path, tiny_tokenizer):
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    path = tmp_path / "tiny-mixed.gguf"
    write_gguf(path, model, tiny_tokenizer, random_blocks=MIXED)
    return path, load_config(resolve_model_path(path)), model


def _counting(monkeypatch) -> list[int]:
    """Counts FileCodes' group decodes."""
    calls: list[int] = []
    real = FileCodes._decode

    def counted(self, members):
        calls.append(len(members))
        return real(self, members)

    monkeypatch.setattr(FileCodes, "_decode", counted)
    return calls


def test_file_codes_are_read_quantizeds_and_formats_decode_nothing(mixed_file, monkeypatch):
    path, config, _ = mixed_file
    eager = read_quantized(path, config)
    calls = _counting(monkeypatch)
    codes = FileCodes(path, config)
    formats = codes.formats()
    assert set(codes) == set(formats) == set(eager) and len(codes) == len(eager)
    assert all(name in codes for name in eager) and "lm_head.bias" not in codes
    assert calls == []  # shapes, membership and names read no codes
    for name, want in eager.items():
        got, meta = codes[name], formats[name]
        assert torch.equal(got.q, want.q) and torch.equal(got.dequantize(), want.dequantize())
        assert (meta.bits, meta.group) == (got.bits, got.group), name
        assert meta.q.shape == got.q.shape and meta.q.dtype == got.q.dtype, name
        assert meta.scale.shape == got.scale.shape and meta.q.device.type == "meta"
    assert {(f.bits, f.group) for f in formats.values()} == {(4, 32), (8, 16)}


def test_a_fused_linears_parts_decode_once_and_deleted_names_are_forgotten(mixed_file, monkeypatch):
    path, config, _ = mixed_file
    calls = _counting(monkeypatch)
    codes = FileCodes(path, config)
    parts = [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"]
    for name in parts:
        codes[name]
    assert calls == [3]  # q, k and v: one group, decoded once
    total = len(codes)
    del codes[parts[0]]
    assert parts[0] not in codes and len(codes) == total - 1
    with pytest.raises(KeyError):
        codes[parts[0]]
    codes[parts[1]]  # the group was dropped with its first part: decoded again
    assert calls == [3, 3]


def test_consumed_linear_codes_from_the_file_are_the_eager_ones(mixed_file):
    """exact_codes(consume=True) over FileCodes makes each fused linear when the graph takes
    it, the same codes as made at once from `read_quantized`, and takes its parts out."""
    path, config, model = mixed_file
    from sgl_lite.backend.runner.models import build_model

    ours = build_model(config, 64)
    ours.load_hf_state_dict({k: v.detach() for k, v in model.state_dict().items()})
    eager, eager_head = exact_codes(ours, "int8", read_quantized(path, config))
    codes = FileCodes(path, config)
    lazy, head = exact_codes(ours, "int8", codes, consume=True)
    assert list(lazy) == list(eager) and torch.equal(head.dequantize(), eager_head.dequantize())
    for key in list(lazy):
        got = lazy.pop(key)
        assert torch.equal(got.dequantize(), eager[key].dequantize()), key
        assert (got.bits, got.group, len(got.parts)) == (
            eager[key].bits,
            eager[key].group,
            len(eager[key].parts),
        )
    assert len(lazy) == 0 and not any(name.startswith("model.layers.") for name in codes)

"""The embedded SmolLM2's files without a forward pass: the GGUF read exactly as transformers'
own loader dequantizes it, and a CUDA device asked for without CUDA named as the error."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.weights.gguf_tensors import read_quantized
from tests.support.gguf_files import name_tables_built_once


def test_embedded_gguf_tensors_are_exactly_transformers_dequantisation(smollm_folder):
    """Our reader of the file (codes and dense tensors, names, q/k un-permuted) against
    transformers' own GGUF loader, which dequantizes every tensor with gguf-py."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from sgl_lite.backend.runner.model_loader import gguf_source, load_config, load_state_dict

    source = gguf_source(smollm_folder)
    assert source is not None and source.suffix == ".gguf"
    config = load_config(smollm_folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with name_tables_built_once():
        loaded = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model)
    state = {name: torch.as_tensor(tensor).float() for name, tensor in loaded["tensors"].items()}
    codes = read_quantized(source, config)
    layer_linears = [n for n in codes if n.startswith("model.layers.")]
    assert len(layer_linears) == 7 * 30 and {codes[n].bits for n in layer_linears} == {4}
    for name, weight in codes.items():
        assert torch.equal(weight.dequantize(), state[name]), name
    dense = load_state_dict(smollm_folder, config)
    assert set(dense) == set(state)
    for name, tensor in dense.items():
        assert torch.equal(tensor, state[name]), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error(smollm_folder):
    with pytest.raises(ValueError, match="CUDA is not available.*available: cpu"):
        ModelRunner(smollm_folder, EngineConfig(device="cuda", max_total_tokens=64))

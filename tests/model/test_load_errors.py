"""A model folder we cannot run is refused at load with a ModelLoadError (a ValueError) that
names the file, field or tensor at fault, never an exception from inside torch."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.runner.model_loader import ModelLoadError
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models import SUPPORTED_MODEL_TYPES
from tests.support import NUM_THREADS
from tests.support.tiny import TINY_LLAMA

WEIGHTS = "model.safetensors"


@pytest.fixture
def folder(tiny_llama_folder):
    """A loadable tiny Llama folder (config, weights, tokenizer) for each test to damage."""
    return tiny_llama_folder


def load(folder) -> ModelRunner:
    config = EngineConfig(max_total_tokens=256, device="cpu", dtype="float32", quantization="none")
    return ModelRunner(folder, config)


def edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(folder, edit) -> None:
    state = load_file(folder / WEIGHTS)
    edit(state)
    save_file(state, folder / WEIGHTS, metadata={"format": "pt"})


def test_the_undamaged_folder_loads(folder):
    assert load(folder).model.config.model_type == "llama"


def test_a_folder_without_config_json_names_it(folder):
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json"):
        Engine(model_path=str(folder), num_threads=NUM_THREADS, max_total_tokens=256)


def test_an_unsupported_model_type_is_refused_with_the_supported_list(tmp_path, tiny_tokenizer):
    AutoModelForCausalLM.from_config(GPT2Config(n_embd=32, n_layer=1, n_head=2)).save_pretrained(
        tmp_path
    )
    tiny_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'") as info:
        Engine(model_path=str(tmp_path), num_threads=NUM_THREADS, max_total_tokens=256)
    for model_type in SUPPORTED_MODEL_TYPES:
        assert model_type in str(info.value)


def test_an_unreadable_config_json_names_the_file(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json"):
        load(folder)


def test_a_rope_type_we_do_not_run_names_the_field(folder):
    edit_config(folder, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ModelLoadError, match="rope_type 'dynamic'.*supported: default"):
        load(folder)


def test_a_rope_type_nobody_knows_is_refused_at_load(folder):
    edit_config(folder, rope_scaling={"rope_type": "spiral", "factor": 2.0})
    with pytest.raises(ModelLoadError, match="spiral"):
        load(folder)


def test_scaled_rope_without_its_parameters_names_the_missing_one(folder):
    edit_config(folder, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ModelLoadError, match="low_freq_factor|llama3"):
        load(folder)


def test_heads_that_do_not_divide_name_the_field(folder):
    edit_config(folder, num_key_value_heads=3)
    with pytest.raises(ModelLoadError, match="num_key_value_heads"):
        load(folder)


def test_an_activation_we_do_not_run_names_the_field(folder):
    edit_config(folder, hidden_act="relu")
    with pytest.raises(ModelLoadError, match="hidden_act 'relu'"):
        load(folder)


def test_a_missing_tensor_is_named(folder):
    edit_weights(folder, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load(folder)


def test_an_extra_tensor_is_named(folder):
    edit_weights(folder, lambda s: s.update({"model.layers.0.mlp.extra.weight": torch.ones(3)}))
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.0\.mlp\.extra\.weight'"):
        load(folder)


def test_a_tensor_of_the_wrong_shape_is_named_with_both_shapes(folder):
    def shrink(state):
        state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    edit_weights(folder, shrink)
    with pytest.raises(ModelLoadError, match=r"k_proj\.weight'.*\(16, 64\).*\(32, 64\)"):
        load(folder)


def test_weights_from_a_bigger_config_are_refused_through_the_engine(folder, tmp_path_factory):
    other = tmp_path_factory.mktemp("bigger")
    bigger = LlamaConfig(**{**TINY_LLAMA, "hidden_size": 96})
    AutoModelForCausalLM.from_config(bigger).save_pretrained(other)
    (folder / WEIGHTS).write_bytes((other / WEIGHTS).read_bytes())
    with pytest.raises(ModelLoadError, match="model.embed_tokens.weight|shape"):
        Engine(model_path=str(folder), num_threads=NUM_THREADS, max_total_tokens=256)


def test_a_damaged_safetensors_file_names_the_file(folder):
    (folder / WEIGHTS).write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=WEIGHTS):
        load(folder)


def test_a_bias_the_config_does_not_have_is_an_extra_tensor(folder):
    edit_weights(
        folder, lambda s: s.update({"model.layers.0.self_attn.q_proj.bias": torch.ones(64)})
    )
    with pytest.raises(ModelLoadError, match=r"q_proj\.bias"):
        load(folder)

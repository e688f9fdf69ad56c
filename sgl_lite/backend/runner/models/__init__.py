"""The model families we run, by Hugging Face `model_type`: the one place to add the next one.

Most families are the shared decoder of `llama.py` with a `DecoderSpec` of switches (spec.py):
add a spec and a line in `FAMILIES`, map any new weight names in `LlamaForCausalLM.weight_plan`,
and add the family to tests/model/test_families.py. A family that needs a block of its own
gets its own module and names its model class here. The loader refuses any other model_type
with this list.
"""

from __future__ import annotations

from typing import NamedTuple

from transformers import PretrainedConfig

from sgl_lite.backend.runner.models.checkpoint import ModelLoadError
from sgl_lite.backend.runner.models.gemma import GemmaForCausalLM
from sgl_lite.backend.runner.models.llama import LlamaForCausalLM
from sgl_lite.backend.runner.models.spec import LLAMA, DecoderSpec


class Family(NamedTuple):
    """How one `model_type` is built: the model class and the spec it is built with."""

    model: type[LlamaForCausalLM]  # the shared decoder, or a subclass with a block of its own
    spec: DecoderSpec


QWEN2 = DecoderSpec(qkv_bias=True)
QWEN3 = DecoderSpec(qk_norm="head")
OLMO2 = DecoderSpec(qk_norm="projection", norm_placement="post")
GRANITE = DecoderSpec(multipliers=True)
PHI3 = DecoderSpec(fused_checkpoint=True)  # longrope and partial rotary come from its config

FAMILIES: dict[str, Family] = {
    "llama": Family(LlamaForCausalLM, LLAMA),
    "mistral": Family(LlamaForCausalLM, LLAMA),
    "qwen2": Family(LlamaForCausalLM, QWEN2),
    "qwen3": Family(LlamaForCausalLM, QWEN3),
    "olmo2": Family(LlamaForCausalLM, OLMO2),
    "granite": Family(LlamaForCausalLM, GRANITE),
    "phi3": Family(LlamaForCausalLM, PHI3),
    # Gemma's block differs in norms, activation, scale and soft-capping: its own module.
    "gemma": Family(GemmaForCausalLM, LLAMA),
    "gemma2": Family(GemmaForCausalLM, LLAMA),
    "gemma3_text": Family(GemmaForCausalLM, LLAMA),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family_of(config: PretrainedConfig) -> Family:
    """The family of a config; a ModelLoadError listing the supported ones otherwise."""
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise ModelLoadError(
            f"unsupported architecture {config.model_type!r} (config.json model_type); "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return family


def build_model(config: PretrainedConfig, max_positions: int) -> LlamaForCausalLM:
    """The model for `config` with RoPE tables up to `max_positions` (weights not loaded).

    Safe under `torch.device("meta")`: the position tables are always computed on the CPU.
    """
    family = family_of(config)
    return family.model(config, max_positions, spec=family.spec)

"""Rotary position tables, computed once at load for every position up to the context length.

Every rope type is computed on the CPU, outside whatever default-device context the model is
built in (the runner builds it under `torch.device("meta")`, where a table would have no data).
Each position's angles depend on that position alone, never on the batch or the sequence
length, so a K/V row cached in the pool or the radix tree stays valid for every later request.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sgl_lite.backend.runner.models.checkpoint import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
ROPE_ALIASES = {"su": "longrope"}  # Phi-3's first checkpoints name longrope "su"


def rope_parameters(config: PretrainedConfig) -> dict:
    """The config's RoPE settings, whichever name this transformers version gives them."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    params.setdefault("rope_type", params.get("type", "default"))
    params["rope_type"] = ROPE_ALIASES.get(params["rope_type"], params["rope_type"])
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return params


def rotary_dim_of(config: PretrainedConfig, head_dim: int) -> int:
    """How many leading dims of each head RoPE rotates (all of them unless partial rotary)."""
    return int(head_dim * float(rope_parameters(config)["partial_rotary_factor"] or 1.0))


def _inv_freq(config: PretrainedConfig, head_dim: int, params: dict, max_positions: int):
    """(inv_freq (P, R/2) per position, cos/sin scaling) exactly as transformers defines them."""
    rope_type = params["rope_type"]
    if rope_type == "default":
        dim = rotary_dim_of(config, head_dim)
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv_freq = 1.0 / (params["rope_theta"] ** exponents)
        return inv_freq.expand(max_positions, -1), 1.0
    if rope_type != "longrope":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
        return inv_freq.float().expand(max_positions, -1), scaling
    # longrope: short factors up to the pretraining length, long factors past it. transformers
    # switches the whole sequence once it grows past that length; per position is the choice
    # that keeps cached K/V rows valid, and equals transformers on every shorter sequence.
    original = int(params["original_max_position_embeddings"])
    short, scaling = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu")
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=original + 1)
    is_long = (torch.arange(max_positions) >= original)[:, None]
    return torch.where(is_long, long.float()[None], short.float()[None]), scaling


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables (P, R) for every position; R = rotated dims of a head."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        params = rope_parameters(config)
        if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"config.json: unsupported rope_scaling.rope_type {params['rope_type']!r}; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        # NOTE: an explicit CPU context: under an outer `torch.device("meta")` the tables
        # (and transformers' init functions) would otherwise be built without data.
        with torch.device("cpu"):
            try:
                inv_freq, scaling = _inv_freq(config, head_dim, params, max_positions)
            except KeyError as exc:
                raise ModelLoadError(
                    f"config.json: rope_scaling of type {params['rope_type']!r} lacks {exc}"
                ) from exc
            positions = torch.arange(max_positions, dtype=torch.float32)
            freqs = positions[:, None] * inv_freq  # (P, R/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (P, R)
            cos = emb.cos() * scaling
            # The first half negated: rotate_half(x) * sin == roll(x, R/2) * sin_signed (exact).
            sin = freqs.sin() * scaling
            sin = torch.cat((-sin, sin), dim=-1)
        self.rotary_dim = cos.shape[-1]
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, signed sin (T, 1, R) at the given positions (T,), for `apply_rope`."""
        return (
            self.cos.index_select(0, positions).unsqueeze(1).to(dtype),
            self.sin.index_select(0, positions).unsqueeze(1).to(dtype),
        )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x (T, heads, D) by its positions' cos and signed sin tables (T, 1, D).

    Equal to transformers' x * cos + rotate_half(x) * sin, in four ops instead of seven.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope` on the first R dims of each head (T, heads, D); the rest pass unchanged."""
    rot = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)

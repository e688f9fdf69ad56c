"""Fitting a checkpoint's tensors to a model: every tensor used once, every shape checked.

A checkpoint that does not fit its config (a tensor missing, one left over, a wrong shape) is
refused here with the tensor's name, before `load_state_dict(assign=True)` could fail inside
torch or, worse, load silently wrong weights.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

# Tensors some exporters save that carry no weights of ours (we compute RoPE tables at load).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class ModelLoadError(ValueError):
    """A model path that does not exist, cannot be converted, or has an unsupported architecture;
    or a config or checkpoint that does not describe a model we can run (the message names the
    file, field or tensor)."""


class WeightSource(NamedTuple):
    """Where one parameter of ours comes from: checkpoint tensors concatenated along dim 0."""

    names: tuple[str, ...]  # checkpoint names, in concatenation order (q, k, v / gate, up)
    rows: tuple[int, ...] = ()  # the dim-0 size of each part; () for a single tensor


def load_checked(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    plan: dict[str, WeightSource],
    skipped: tuple[str, ...] = (),
) -> None:
    """Fills every parameter of `model` from `state` as `plan` says, after checking it all.

    `plan` maps each of our parameter names to its source; `skipped` names tensors read and
    dropped (an LM head tied to the embeddings). Any tensor missing, left over or of the wrong
    shape is a ModelLoadError naming it; nothing reaches torch unchecked.
    """
    params = dict(model.named_parameters())
    own: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        if name not in plan:  # a bug in a family's name mapping, not in the checkpoint
            raise ModelLoadError(f"no checkpoint tensor is mapped to parameter {name!r}")
        source = plan[name]
        parts = []
        rows = source.rows or (param.shape[0],)
        for hf_name, part_rows in zip(source.names, rows, strict=True):
            if hf_name not in state:
                raise ModelLoadError(f"checkpoint has no tensor {hf_name!r} that the config needs")
            tensor = state[hf_name]
            want = (part_rows, *param.shape[1:])
            if tuple(tensor.shape) != want:
                raise ModelLoadError(
                    f"tensor {hf_name!r} has shape {tuple(tensor.shape)}; "
                    f"the config calls for {want}"
                )
            parts.append(tensor)
        own[name] = parts[0] if len(parts) == 1 else _stacked(parts)
    used = {n for name in params for n in plan[name].names} | set(skipped)
    extra = sorted(n for n in state if n not in used and not n.endswith(IGNORED_SUFFIXES))
    if extra:
        shown = ", ".join(repr(n) for n in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise ModelLoadError(f"checkpoint has tensors the config does not describe: {shown}{more}")
    model.load_state_dict(own, strict=False, assign=True)


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts joined along dim 0. Parts on the meta device (linears whose codes live
    elsewhere) give an empty meta tensor directly: `torch.cat` on meta imports torch._dynamo
    (about a second of a load)."""
    if all(part.is_meta for part in parts):
        rows = sum(part.shape[0] for part in parts)
        return torch.empty((rows, *parts[0].shape[1:]), dtype=parts[0].dtype, device="meta")
    return torch.cat(parts)

"""Engine start-up: the config from the caller's arguments, our logger, the model and
tokenizer the engine runs (unless the caller hands in its own, as the unit tests do), and the
per-thread state each loop thread sets first.

`load_model` runs once, on the engine's first loop thread (`Engine.__init__` waits for it);
`prepare_loop_thread` at the start of every loop thread (they end when idle: loop_thread).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.common.tokenizer import Tokenizer

logger = logging.getLogger("sgl_lite")


def build_config(model_path: str | EngineConfig | None, kwargs: dict[str, Any]) -> EngineConfig:
    """The engine's config: a given `EngineConfig`, or one built from keyword arguments (SGLang's
    `mem_fraction_static` becomes `max_total_tokens` first, as SGLang sizes its pool)."""
    if isinstance(model_path, EngineConfig):
        if kwargs:
            raise ValueError(f"give a config or keyword arguments, not both: {sorted(kwargs)}")
        return model_path
    if "mem_fraction_static" in kwargs:
        from sgl_lite.backend.engine.memory import resolve_mem_fraction

        kwargs = resolve_mem_fraction({"model_path": model_path, **kwargs})
        model_path = kwargs.pop("model_path")
    return EngineConfig.from_kwargs(model_path=model_path, **kwargs)


def configure_logging(level: str) -> None:
    """Our own logger only: its level, and a handler when nothing would print its records."""
    logger.setLevel(level.upper())
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


def load_model(
    config: EngineConfig, runner: Any, tokenizer: Tokenizer | None
) -> tuple[Path | None, Any, Tokenizer]:
    """(model folder, runner, tokenizer): whichever of runner and tokenizer is None is loaded
    from `config.model_path` (tokenizer overrides: `tokenizer_path`, `chat_template`)."""
    if runner is not None and tokenizer is not None:
        return None, runner, tokenizer
    # NOTE: imported here so an engine over a fake runner never loads the model code
    from sgl_lite.backend.runner.model_loader import resolve_model_path
    from sgl_lite.backend.runner.model_runner import ModelRunner
    from sgl_lite.backend.runner.tokenizer_overrides import load_tokenizer_with_overrides

    folder = resolve_model_path(config.model_path)
    if tokenizer is None:
        tokenizer = load_tokenizer_with_overrides(
            folder, config.tokenizer_path, config.chat_template, config.trust_remote_code
        )
    return folder, runner or ModelRunner(folder, config), tokenizer


def eos_token_ids(runner: Any, tokenizer: Tokenizer) -> set[int]:
    """The ids that end a generation: the model config's `eos_token_id` (one or a list) and the
    tokenizer's own."""
    ids = getattr(getattr(runner, "hf_config", None), "eos_token_id", None)
    eos = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    return eos


def prepare_loop_thread(runner: Any) -> bool:
    """Sets the per-thread state a new loop thread needs before its first step: no autograd,
    and the runner's CUDA device. False (and logged) when the device cannot be taken."""
    torch.set_grad_enabled(False)
    device = getattr(runner, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        try:
            torch.cuda.set_device(device)
        except Exception:
            logger.exception("engine loop thread cannot use %s", device)
            return False
    return True

"""sglang.srt.utils.hf_transformers_utils: `get_tokenizer` for whatever model a test names.

Every model a test names is served as sgl_lite's default model, so every name gets its tokenizer.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _default_tokenizer() -> Any:
    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("default"))


def get_tokenizer(tokenizer_name: str, *args: Any, **kwargs: Any) -> Any:
    """The served model's tokenizer (the name is the one the test launched the server with)."""
    return _default_tokenizer()

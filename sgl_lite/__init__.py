"""sgl_lite: SGLang's frontend language over a small engine; `import sgl_lite as sgl`.

Importing it loads the frontend only (no torch, no outlines-core); `sgl.Engine` loads the engine
on first use.
"""

from __future__ import annotations

from typing import Any

from sgl_lite.cache_view import show_cache
from sgl_lite.frontend import globals as _globals
from sgl_lite.frontend.api import (
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from sgl_lite.frontend.backends.base import StepTimeout
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.backends.openai import OpenAI
from sgl_lite.frontend.backends.runtime import Runtime
from sgl_lite.frontend.backends.runtime_endpoint import RuntimeEndpoint
from sgl_lite.frontend.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgl_lite.frontend.globals import set_default_backend
from sgl_lite.frontend.interpreter import ProgramError, ProgramState
from sgl_lite.frontend.program import SglFunction, flush_cache, get_server_info
from sgl_lite.frontend.unsupported import (  # SGLang names that raise, saying what to use
    Anthropic,
    Crusoe,
    LiteLLM,
    ServerArgs,
    VertexAI,
    global_config,
    image,
    separate_reasoning,
    video,
)

__version__ = "0.1.0"

# A program run without a backend, when none was set, starts `sgl.Runtime()` on the embedded
# model (the program layer calls this factory; it cannot import the backends above it).
_globals.set_default_backend_factory(Runtime)


def __getattr__(name: str) -> Any:
    # NOTE: the Engine loads torch and the model code; `import sgl_lite` stays light.
    if name == "Engine":
        from sgl_lite.backend.engine import Engine

        return Engine
    if name == "CustomLogitProcessor":  # SGLang's base class for request logit processors
        from sgl_lite.backend.scheduler.custom_logits import CustomLogitProcessor

        return CustomLogitProcessor
    raise AttributeError(f"module 'sgl_lite' has no attribute {name!r}")


__all__ = [
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "select",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "set_default_backend",
    "flush_cache",
    "get_server_info",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
    "Runtime",
    "RuntimeEndpoint",
    "StepTimeout",
    "OpenAI",
    "Engine",
    "CustomLogitProcessor",
    "EngineBackend",
    "ProgramState",
    "ProgramError",
    "SglFunction",
    "show_cache",
    "__version__",
    # refused (docs/sglang_parity.md): calling one raises NotImplementedError saying why
    "Anthropic",
    "Crusoe",
    "LiteLLM",
    "ServerArgs",
    "VertexAI",
    "global_config",
    "image",
    "separate_reasoning",
    "video",
]

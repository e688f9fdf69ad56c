"""sgl_lite: SGLang's frontend language over a small engine; `import sgl_lite as sgl`."""

from __future__ import annotations

from typing import Any

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
from sgl_lite.frontend.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgl_lite.frontend.globals import flush_cache, get_server_info, set_default_backend
from sgl_lite.frontend.interpreter import ProgramError, ProgramState
from sgl_lite.frontend.program import SglFunction

__version__ = "0.1.0"

_LAZY = {
    "Runtime": "sgl_lite.frontend.backends.runtime",
    "RuntimeEndpoint": "sgl_lite.frontend.backends.runtime_endpoint",
    "OpenAI": "sgl_lite.frontend.backends.openai",
    "EngineBackend": "sgl_lite.frontend.backends.engine",
    "Engine": "sgl_lite.backend.engine",
    "show_cache": "sgl_lite.cache_view",
}


def __getattr__(name: str) -> Any:
    # NOTE: backends load torch / requests / openai; `import sgl_lite` stays light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
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
    "OpenAI",
    "Engine",
    "EngineBackend",
    "ProgramState",
    "ProgramError",
    "SglFunction",
    "show_cache",
    "__version__",
]

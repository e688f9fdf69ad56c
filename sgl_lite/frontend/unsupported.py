"""SGLang 0.5 public names that sgl_lite refuses, each saying what to use instead.

They exist so that a program written for SGLang fails where it uses one, with a message that
names the replacement (NotImplementedError), never with an AttributeError at import. The table
of every name is docs/sglang_parity.md. `global_config` is partly real: its `default_backend`
is the default backend, and each switch reads sgl_lite's fixed behaviour.
"""

from __future__ import annotations

from typing import Any

from sgl_lite.frontend import globals as g

_TEXT_ONLY = "sgl_lite serves text-only models; multimodal input is not supported"


def image(expr: Any) -> Any:
    """Refused: SGLang's image input."""
    raise NotImplementedError(f"sgl.image(): {_TEXT_ONLY}. Describe the image in text instead.")


def video(path: str, num_frames: int) -> Any:
    """Refused: SGLang's video input."""
    raise NotImplementedError(f"sgl.video(): {_TEXT_ONLY}. Describe the video in text instead.")


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Any:
    """Refused: SGLang's reasoning-content splitter."""
    raise NotImplementedError(
        "sgl.separate_reasoning(): no reasoning parser (the embedded model does not reason); "
        "generate with sgl.gen('x', stop='</think>') and gen the answer after it"
    )


def _refused_backend(name: str, instead: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"sgl.{name} is not supported: {instead}")

    doc = f"Refused: SGLang's {name} backend ({instead})."
    return type(name, (), {"__init__": __init__, "__doc__": doc})


_OPENAI_COMPAT = (
    "serve the model behind an OpenAI-compatible API and use sgl.OpenAI(model, base_url=...)"
)
Anthropic = _refused_backend("Anthropic", _OPENAI_COMPAT)
LiteLLM = _refused_backend("LiteLLM", _OPENAI_COMPAT)
VertexAI = _refused_backend("VertexAI", _OPENAI_COMPAT)
Crusoe = _refused_backend("Crusoe", _OPENAI_COMPAT)
ServerArgs = _refused_backend(
    "ServerArgs",
    "pass engine options as keywords: sgl.Runtime(model_path=..., ...) or sgl.Engine(...), "
    "or launch_server's command-line flags",
)

# SGLang's global switches, with the value sgl_lite's behaviour fixes.
_FIXED = {
    "verbosity": 0,
    "skip_special_tokens_in_output": True,
    "spaces_between_special_tokens_in_out": True,
    "enable_precache_with_tracing": True,
    "enable_parallel_encoding": False,  # forks join by text; no KV concatenation
}


class GlobalConfig:
    """SGLang's `sgl.global_config`: `default_backend` is real; the switches read sgl_lite's
    fixed behaviour, and setting one to anything else raises NotImplementedError."""

    @property
    def default_backend(self) -> Any:
        """The default backend (as `sgl.set_default_backend` sets it)."""
        return g.get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        g.set_default_backend(backend)

    def __getattr__(self, name: str) -> Any:
        if name in _FIXED:
            return _FIXED[name]
        raise NotImplementedError(
            f"sgl.global_config.{name} does not exist in sgl_lite; its settings are "
            f"default_backend and {', '.join(_FIXED)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "default_backend":
            object.__setattr__(self, name, value)
        elif name in _FIXED and value == _FIXED[name]:
            return
        else:
            fixed = f" (it is fixed at {_FIXED[name]!r})" if name in _FIXED else ""
            raise NotImplementedError(
                f"sgl.global_config.{name} = {value!r} is not supported{fixed}: use "
                "set_default_backend for the backend, run() keywords for sampling defaults"
            )


global_config = GlobalConfig()

"""EngineConfig: one frozen, validated set of engine settings (the server's flags in snake_case).

Built once: `EngineConfig.from_kwargs` (what `Engine` uses) takes the arguments, fills what they
leave unset from the environment (`SGL_LITE_NUM_THREADS`), and constructs the frozen object;
`__post_init__` only checks. Constructing `EngineConfig(...)` directly reads no environment.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# `auto` is resolved by the model runner against the checkpoint and the CPU (backend/weights/).
DTYPE_CHOICES = ("auto", *DTYPES)
QUANTIZATIONS = ("auto", "none", "int8", "int4")
SCHEDULE_POLICIES = ("lpm", "fcfs")
GRAMMAR_BACKENDS = ("outlines", "llguidance", "xgrammar", "auto")  # see constrained/compiler.py
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# how "auto" tool-choice answers are read (see server/tool_formats.py)
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "granite", "phi4_mini", "pythonic")


def default_device() -> str:
    """CUDA when a GPU is present, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine settings, as SGLang's ServerArgs names them; checked once in __post_init__."""

    model_path: str | None = None
    served_model_name: str | None = None
    device: str = field(default_factory=default_device)
    dtype: str = "auto"
    # `auto`: the file's own quantization (a GGUF's 4/8-bit codes, never coarser) on the
    # fastest int kernel this CPU has for decode and short passes, dense weights for long ones
    # (backend/runner/weights/formats.py); `none`: dense weights only.
    quantization: str = "auto"
    # SGLang's flag: batch- and pass-invariant numerics, so greedy output is identical with the
    # radix cache on and off, alone and batched (int kernels on every pass and float64
    # attention, or float64 throughout); slower, paid for only by those who ask.
    enable_deterministic_inference: bool = False
    # NOTE: torch's intra-op thread count is process-wide; the engine sets it only when this is
    # given (here or by SGL_LITE_NUM_THREADS through from_kwargs), and leaves it alone otherwise.
    num_threads: int | None = None
    max_total_tokens: int = 32768
    max_running_requests: int = 64
    chunked_prefill_size: int = 2048
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    context_length: int | None = None
    # `auto`: the automaton (outlines-core) where it expresses the whole constraint exactly (its
    # budget rule alone is exact; a grammar backend's closer bounds it from above), a grammar
    # backend (llguidance) otherwise.
    grammar_backend: str = "auto"
    constrained_json_whitespace_pattern: str | None = None
    disable_jump_forward: bool = False
    # Grammar masks on a worker thread while the forward runs (backend/mask_prefetch.py);
    # False computes them after it, on the loop thread.
    overlap_masks: bool = True
    grammar_compile_timeout: float = 10.0
    random_seed: int = 0
    log_level: str = "info"
    # Overload and deadlines: None = unbounded queue / no deadline.
    max_queued_requests: int | None = None
    request_timeout: float | None = None
    # SGLang's --tokenizer-path / --chat-template / --trust-remote-code (tokenizer_overrides.py)
    tokenizer_path: str | None = None
    chat_template: str | None = None
    trust_remote_code: bool = False
    tool_call_parser: str = "auto"  # vLLM/SGLang's --tool-call-parser
    # SGLang's --enable-custom-logit-processor: requests may carry a dill-pickled processor,
    # code this process runs (scheduler/custom_logits.py); off, such a request is a 400
    enable_custom_logit_processor: bool = False

    def __post_init__(self) -> None:
        if not self.device:
            raise ValueError("device must be a torch device name such as 'cpu' or 'cuda'")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, "
                f"got {self.schedule_policy!r}"
            )
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(
                f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, "
                f"got {self.grammar_backend!r}"
            )
        if self.grammar_backend == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
            raise ValueError(
                "grammar_backend=xgrammar needs the xgrammar package, an optional extra: "
                "pip install 'sgl_lite[xgrammar]' (or choose auto, llguidance or outlines)"
            )
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        for name, low in (
            ("max_total_tokens", 16),
            ("max_running_requests", 1),
            ("chunked_prefill_size", 1),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if self.grammar_compile_timeout <= 0:
            raise ValueError("grammar_compile_timeout must be > 0 seconds")

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype asked for; None for `auto` (the model runner resolves it)."""
        return DTYPES.get(self.dtype)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Builds a config from keyword arguments, then the environment for what they leave
        unset (None or ""); names any unknown argument."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine argument(s) {unknown}; known: {sorted(known)}")
        values = {k: v for k, v in kwargs.items() if not (k == "device" and not v)}
        threads = os.environ.get("SGL_LITE_NUM_THREADS")
        if values.get("num_threads") is None and threads:
            if not threads.isdigit():
                raise ValueError(f"SGL_LITE_NUM_THREADS must be an int >= 1, got {threads!r}")
            values["num_threads"] = int(threads)
        return cls(**values)

"""The Backend protocol: the only thing the interpreter calls to reach a model.

A backend gets plain data (the prompt text and messages, resolved SGLang sampling params) and
returns plain data (text, meta_info, a choice decision). It never sees IR nodes or states.
Implementations: `EngineBackend` (in-process), `RuntimeEndpoint` (HTTP, SGLang's /generate),
`OpenAI` (any OpenAI-compatible server).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sgl_lite.frontend.chat_template import ChatTemplate
from sgl_lite.frontend.choices import ChoicesDecision, ChoicesMethod


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """What a program has produced so far, as text and as chat messages.

    `messages` are the closed messages; `open_role` / `open_content` the role being written.
    """

    text: str
    messages: tuple[dict[str, str], ...] = ()
    open_role: str | None = None
    open_content: str = ""


@dataclass(frozen=True, kw_only=True)
class GenRequest:
    """One generation: SGLang `sampling_params` (already resolved) plus the logprob options."""

    sampling_params: dict[str, Any] = field(default_factory=dict)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    timeout: float | None = None  # seconds the step may take (gen/run timeout=); None: no bound


class StepTimeout(TimeoutError):
    """A step ran past its `timeout` (gen(timeout=...) or run(timeout=...)); the backend
    aborted it (the engine freed its slots). The program's `error()` is this exception."""

    def __init__(self, seconds: float, detail: str = "") -> None:
        super().__init__(
            f"the step timed out after {seconds:g} s" + (f": {detail}" if detail else "")
        )
        self.seconds = seconds


# The engine's abort of a request past its deadline (engine.py); other aborts that mention a
# timeout (a grammar compile's) are errors of their own, not the step's deadline.
REQUEST_TIMED_OUT = "request timed out"


def timeout_of(meta: dict[str, Any], request: GenRequest) -> StepTimeout | None:
    """The StepTimeout a finished result stands for: an abort of a request that had a timeout,
    with the engine's "request timed out" message; None otherwise."""
    reason = (meta or {}).get("finish_reason") or {}
    message = str(reason.get("message") or "") if isinstance(reason, dict) else ""
    if request.timeout is None or reason.get("type") != "abort":
        return None
    if REQUEST_TIMED_OUT not in message:
        return None
    return StepTimeout(request.timeout, message)


class GenResult(NamedTuple):
    """A generation's text (stop strings trimmed) and its meta_info (tokens, finish reason)."""

    text: str
    meta_info: dict[str, Any]


class Backend(ABC):
    """Base class of the frontend's backends (the protocol, with defaults where one exists)."""

    chat_template: ChatTemplate

    @abstractmethod
    def generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        """Continues `prompt.text`; returns the new text (stop strings trimmed) and meta_info."""

    def generate_stream(self, prompt: Prompt, request: GenRequest) -> Iterator[GenResult]:
        """Like `generate`, yielding results with the cumulative text; the last has full meta."""
        yield self.generate(prompt, request)

    def select(
        self, prompt: Prompt, choices: Sequence[str], method: ChoicesMethod
    ) -> ChoicesDecision:
        """Scores every choice as a continuation of `prompt.text` and lets `method` decide."""
        raise NotImplementedError(f"{type(self).__name__} does not support select")

    def cache_prefix(self, text: str) -> None:  # noqa: B027 - a no-op by default
        """Prefills `text` so later requests that start with it hit the prefix cache."""

    def flush_cache(self) -> bool:
        """Empties the prefix cache; False when the backend has none to flush."""
        return False

    def get_server_info(self) -> dict[str, Any]:
        """What the backend reports about itself (cache hit rate, config, ...)."""
        return {}

    def shutdown(self) -> None:  # noqa: B027 - a no-op by default
        """Releases the backend's engine or connection."""

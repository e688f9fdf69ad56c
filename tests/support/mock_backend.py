"""A scripted frontend Backend for the frontend's unit tests (no model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sgl_lite.frontend.backends.base import Backend, GenRequest, GenResult, Prompt
from sgl_lite.frontend.chat_template import get_chat_template


class MockBackend(Backend):
    """Replies with `reply(prompt_text, request)`; records every call in `calls`.

    `delay` makes generate sleep so concurrent calls overlap; `max_in_flight` records the most
    generate calls seen at once. `select_logprobs` maps a choice to its token logprobs.
    """

    def __init__(
        self,
        reply: Callable[[str, GenRequest], str] | None = None,
        *,
        template: str = "chatml",
        delay: float = 0.0,
        select_logprobs: dict[str, list[float]] | None = None,
    ) -> None:
        self.chat_template = get_chat_template(template)
        self.reply = reply or (lambda text, req: "ok")
        self.delay = delay
        self.select_logprobs = select_logprobs or {}
        self.calls: list[tuple[str, str, object]] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self.max_in_flight = 0

    def _record(self, kind: str, text: str, extra: object = None) -> None:
        with self._lock:
            self.calls.append((kind, text, extra))

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]

    def generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        self._record("generate", prompt.text, request)
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)
            text = self.reply(prompt.text, request)
        finally:
            with self._lock:
                self._in_flight -= 1
        return GenResult(
            text,
            {
                "prompt_tokens": len(prompt.text),
                "completion_tokens": len(text),
                "cached_tokens": 0,
                "finish_reason": {"type": "stop"},
            },
        )

    def generate_stream(self, prompt: Prompt, request: GenRequest):
        text, meta = self.generate(prompt, request)
        for i in range(1, len(text) + 1, 2):
            yield GenResult(text[:i], {})
        yield GenResult(text, meta)

    def select(self, prompt, choices, method):
        self._record("select", prompt.text, tuple(choices))
        lps = [self.select_logprobs.get(c, [-5.0]) for c in choices]
        uncond = [[-1.0] * len(x) for x in lps] if method.requires_unconditional_logprobs else None
        return method(choices=choices, token_logprobs=lps, unconditional_token_logprobs=uncond)

    def cache_prefix(self, text: str) -> None:
        self._record("cache_prefix", text)

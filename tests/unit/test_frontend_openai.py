"""The OpenAI backend's requests, against a fake client that records them (no server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import sgl_lite as sgl


class FakeCompletions:
    """Records `create(**kwargs)` and answers like the OpenAI SDK (attributes, not dicts)."""

    def __init__(self, chat: bool, reply: str) -> None:
        self.chat, self.reply = chat, reply
        self.calls: list[dict[str, Any]] = []

    def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        choice = (
            SimpleNamespace(message=SimpleNamespace(content=self.reply), finish_reason="stop")
            if self.chat
            else SimpleNamespace(text=self.reply, finish_reason="length")
        )
        usage = SimpleNamespace(prompt_tokens=5, completion_tokens=2, prompt_tokens_details=None)
        return SimpleNamespace(id="r1", choices=[choice], usage=usage)


def backend_with_fake_client(is_chat_model: bool, reply: str = "Paris") -> Any:
    backend = sgl.OpenAI(
        "some-model", base_url="http://127.0.0.1:9/v1", is_chat_model=is_chat_model
    )
    fake = FakeCompletions(is_chat_model, reply)
    backend.client = SimpleNamespace(
        chat=SimpleNamespace(completions=fake), completions=fake, base_url="fake"
    )
    return backend, fake


def test_completion_request_maps_sglang_names_and_sends_the_rest_as_extra_body():
    backend, fake = backend_with_fake_client(is_chat_model=False)

    @sgl.function
    def prog(s):
        s += "Q: capital of France?\nA:" + sgl.gen(
            "a", max_tokens=7, temperature=0.5, top_k=3, regex="[A-Z][a-z]+"
        )

    state = prog.run(backend=backend)
    assert state["a"] == "Paris"
    (call,) = fake.calls
    assert call["model"] == "some-model" and call["prompt"].endswith("A:")
    assert call["max_tokens"] == 7 and call["temperature"] == 0.5 and call["top_p"] == 1.0
    # top_k and regex are not OpenAI's: they travel in the extra body; neutral values do not.
    assert call["extra_body"] == {"top_k": 3, "regex": "[A-Z][a-z]+"}
    assert "stop" not in call  # the default template has no stop strings
    assert state.get_meta_info("a")["finish_reason"] == {"type": "length"}


def test_chat_model_sends_the_closed_messages_and_needs_gen_right_after_assistant_begin():
    backend, fake = backend_with_fake_client(is_chat_model=True)

    @sgl.function
    def chat(s):
        s += sgl.user("Capital of France?")
        s += sgl.assistant(sgl.gen("a", max_tokens=4))

    assert chat.run(backend=backend)["a"] == "Paris"
    assert fake.calls[0]["messages"] == [{"role": "user", "content": "Capital of France?"}]

    @sgl.function
    def mid_message(s):
        s += sgl.assistant_begin() + "The answer: " + sgl.gen("a")

    with pytest.raises(sgl.ProgramError, match="right after assistant_begin"):
        mid_message.run(backend=backend)["a"]

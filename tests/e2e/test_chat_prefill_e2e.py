"""Response prefill on the embedded model through the official `openai` client: with
`continue_final_message` (in `extra_body`, as vLLM's and SGLang's docs show) the answer is
exactly what the engine generates after transformers' `continue_final_message` render, and
holds only the continuation, streamed or not."""

from __future__ import annotations

import openai
import pytest

MESSAGES = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]
PREFILL = {"continue_final_message": True, "add_generation_prompt": False}


def test_prefill_continues_the_assistant_message(client, engine):
    reply = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=4, temperature=0, extra_body=PREFILL
    )
    content = reply.choices[0].message.content
    prompt = engine.tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, continue_final_message=True
    )
    assert prompt.endswith("<|im_start|>assistant\nThe capital of France is")
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    expected = engine.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0}
    )
    assert content == expected["text"] and reply.usage.prompt_tokens == len(ids)
    assert "Paris" in content and not content.startswith("The capital")

    stream = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_body=PREFILL,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == content


def test_prefill_after_a_user_message_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="assistant"):
        client.chat.completions.create(
            model="default", messages=MESSAGES[:1], max_tokens=2, extra_body=PREFILL
        )

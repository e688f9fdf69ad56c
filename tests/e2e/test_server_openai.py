"""The server's OpenAI API driven by the official `openai` client: chat, streaming, JSON output,
completions with logprobs, cached-token usage, and OpenAI-shaped errors."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.server import flush, url_fixture

SERVED = "smollm2"


url = url_fixture(served_model_name=SERVED)  # on the session's engine


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_completion_answers_with_usage(client):
    reply = client.chat.completions.create(
        model=SERVED, messages=ask("What is 2 + 2?"), max_tokens=8, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.model == SERVED and reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_equals_the_plain_answer_and_reports_usage(client):
    kwargs = {
        "model": "default",
        "messages": ask("Name a color."),
        "max_tokens": 8,
        "temperature": 0,
    }
    plain = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [plain.choices[0].finish_reason]
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    )


def test_chat_logit_bias_forces_and_bans_tokens(client, engine):
    kwargs = {"model": SERVED, "messages": ask("Name a fruit."), "max_tokens": 3, "temperature": 0}
    plain = client.chat.completions.create(**kwargs, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    token = engine.tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = client.chat.completions.create(**kwargs, logit_bias={str(token): 100})
    assert forced.choices[0].message.content == engine.tokenizer.decode([token] * 3)
    ban = {str(t): -100 for t in engine.tokenizer.encode(first, add_special_tokens=False)}
    banned = client.chat.completions.create(**kwargs, logprobs=True, logit_bias=ban)
    assert banned.choices[0].logprobs.content[0].token != first
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(**kwargs, logit_bias={str(token): 100.5})


def test_repeated_prompt_reports_cached_tokens(client, url):
    flush(url)
    kwargs = {
        "model": SERVED,
        "messages": ask("Describe the moon in one line."),
        "max_tokens": 4,
        "temperature": 0,
    }
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_completion_logprobs_cover_every_token(client):
    reply = client.completions.create(
        model=SERVED, prompt="The sky is", max_tokens=5, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert len(lp.tokens) == len(lp.token_logprobs) == reply.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_completions_with_n_and_a_list_of_prompts(client):
    reply = client.completions.create(
        model=SERVED, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=3, temperature=0, n=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text == reply.choices[1].text  # greedy samples agree
    streamed = client.completions.create(
        model=SERVED, prompt="1, 2, 3,", max_tokens=3, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def test_chat_logprobs_and_top_logprobs(client):
    reply = client.chat.completions.create(
        model=SERVED,
        messages=ask("Hi!"),
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token for t in content)


def test_errors_have_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4", messages=ask("hi"), max_tokens=2)
    assert err.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=SERVED, messages=ask("hi"), max_tokens=2, temperature=5
        )
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED, prompt="hi", max_tokens=100_000)
    assert "context length" in err.value.body["message"]
    ok = client.completions.create(model=SERVED, prompt="hi", max_tokens=1)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_response_format_json_schema_output_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
        },
        "required": ["name", "color"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=SERVED,
        messages=ask("Invent a pet and its color, as JSON."),
        max_tokens=48,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pet", "schema": schema, "strict": True},
        },
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_response_format_json_object_and_regex_extension(client):
    reply = client.chat.completions.create(
        model=SERVED,
        messages=ask("Give me a JSON object about a cat."),
        max_tokens=48,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = reply.choices[0].message.content
    assert text.startswith("{")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    reply = client.chat.completions.create(
        model=SERVED,
        messages=ask("Pick a number."),
        max_tokens=6,
        temperature=0,
        extra_body={"regex": r"[0-9]{1,3}"},
    )
    assert reply.choices[0].message.content.isdigit()

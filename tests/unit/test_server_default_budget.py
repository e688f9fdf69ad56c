"""The token budget of a chat or Responses body that names none: the room the context leaves,
at most `DEFAULT_MAX_TOKENS` (OpenAI's "model's maximum output", below the context), so one
ordinary-looking request cannot decode for minutes; an explicit budget up to the room is served
as sent, and `create_app(default_max_tokens=None)` gives SGLang's and vLLM's whole room.

A scripted engine records the max_new_tokens each route submitted; no model runs.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from sgl_lite.server import create_app
from sgl_lite.server.protocol import DEFAULT_MAX_TOKENS, omitted_budget
from tests.support.fakes import ReplyEngine
from tests.support.server import serve

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
RESPONSE = {"input": "Hi"}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSE)]


@pytest.fixture
def engine(tiny_tokenizer) -> ReplyEngine:
    scripted = ReplyEngine(tiny_tokenizer)
    scripted.context_length = 4 * DEFAULT_MAX_TOKENS  # the room is more than the default
    return scripted


def served(engine: ReplyEngine, **app_kwargs: object) -> contextlib.AbstractContextManager[str]:
    """The app over `engine` on loopback (`create_app(engine, **app_kwargs)`)."""
    return serve(create_app(engine, **app_kwargs))


def budget(url: str, engine: ReplyEngine, path: str, body: dict) -> int:
    """The max_new_tokens the route submitted for `body`."""
    engine.replies[:] = ["Hello."]
    response = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return engine.requests[-1]["params"]["max_new_tokens"]


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_body_without_a_budget_gets_the_default_not_the_whole_context(engine, path, body):
    with served(engine) as url:
        assert budget(url, engine, path, body) == DEFAULT_MAX_TOKENS
        room = engine.max_new_tokens_room(len(engine.requests[-1]["ids"]))
        assert room > DEFAULT_MAX_TOKENS  # so the default, not the context, bound it


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_short_context_leaves_less_than_the_default(engine, path, body):
    engine.context_length = DEFAULT_MAX_TOKENS // 2
    with served(engine) as url:
        got = budget(url, engine, path, body)
    assert got == engine.max_new_tokens_room(len(engine.requests[-1]["ids"]))
    assert got < DEFAULT_MAX_TOKENS


def test_an_explicit_budget_above_the_default_is_served_as_sent(engine):
    large = 3 * DEFAULT_MAX_TOKENS
    with served(engine) as url:
        assert budget(url, engine, "/v1/chat/completions", {**CHAT, "max_tokens": large}) == large
        chat = {**CHAT, "max_completion_tokens": large}
        assert budget(url, engine, "/v1/chat/completions", chat) == large
        response = {**RESPONSE, "max_output_tokens": large}
        assert budget(url, engine, "/v1/responses", response) == large


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_no_default_gives_the_whole_room_as_sglang_does(engine, path, body):
    with served(engine, default_max_tokens=None) as url:
        got = budget(url, engine, path, body)
    assert got == engine.max_new_tokens_room(len(engine.requests[-1]["ids"]))
    assert got > DEFAULT_MAX_TOKENS


def test_a_server_default_of_its_own_bounds_the_omitted_budget(engine):
    with served(engine, default_max_tokens=7) as url:
        assert budget(url, engine, "/v1/chat/completions", CHAT) == 7
        assert budget(url, engine, "/v1/responses", RESPONSE) == 7


def test_omitted_budget_is_the_smaller_of_the_room_and_the_default():
    assert omitted_budget(5000, 1024) == 1024
    assert omitted_budget(300, 1024) == 300
    assert omitted_budget(5000, None) == 5000


@pytest.mark.parametrize(("argv", "bound"), [([], DEFAULT_MAX_TOKENS), (["0"], None), (["64"], 64)])
def test_the_default_max_tokens_flag_sets_the_bound(argv, bound):
    from sgl_lite.server_args import build_parser, check_args, default_max_tokens

    parser = build_parser()
    args = parser.parse_args(["--default-max-tokens", *argv] if argv else [])
    check_args(parser, args)
    assert default_max_tokens(args.default_max_tokens) == bound


def test_a_negative_default_max_tokens_is_refused_naming_the_flag(capsys):
    from sgl_lite.server_args import build_parser, check_args

    parser = build_parser()
    with pytest.raises(SystemExit):
        check_args(parser, parser.parse_args(["--default-max-tokens", "-1"]))
    assert "--default-max-tokens" in capsys.readouterr().err

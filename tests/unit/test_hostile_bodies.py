"""Hostile request bodies get a 4xx with a JSON error on every JSON route, never a 500 (the
real engine over a fake runner behind the app: no model files)."""

from __future__ import annotations

import httpx
import pytest

from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from tests.support.fakes import ByteTokenizer, FakeRunner
from tests.support.server import serve

ROUTES = ["/generate", "/abort_request", "/v1/completions", "/v1/chat/completions"]
LIMIT = 64 * 1024


def deep(n: int) -> bytes:
    return b'{"text": "x", "sampling_params": ' + b'{"a": ' * n + b"1" + b"}" * n + b"}"


BODIES = {
    "nested 20 000 deep (array)": b"[" * 20_000 + b"]" * 20_000,
    "nested 20 000 deep (object)": deep(20_000),
    "nested 900 deep where a string belongs": b'{"text": ' + b"[" * 900 + b"]" * 900 + b"}",
    "not UTF-8": b'{"text": "\xff\xfe"}',
    "not JSON": b"hello, world",
    "empty": b"",
    "a JSON array": b'["text"]',
    "a JSON string": b'"text"',
    "an integer of 5000 digits": b'{"text": "x", "rid": ' + b"7" * 5000 + b"}",
    "a lone surrogate": b'{"text": "\\ud800"}',
}


@pytest.fixture(scope="module")
def url():
    with (
        Engine(runner=FakeRunner(num_slots=256), tokenizer=ByteTokenizer(), device="cpu") as engine,
        serve(create_app(engine, max_body_bytes=LIMIT)) as base,
    ):
        yield base


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(BODIES))
def test_hostile_body_is_a_4xx_with_a_json_error(url, route, name) -> None:
    headers = {"Content-Type": "application/json"}
    response = httpx.post(url + route, content=BODIES[name], headers=headers, timeout=30)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.json()["error"]["message"]


@pytest.mark.parametrize("route", ROUTES)
def test_body_over_the_limit_is_413_with_or_without_content_length(url, route) -> None:
    body = b'{"text": "' + b"x" * (LIMIT + 10) + b'"}'
    sized = httpx.post(url + route, content=body, timeout=30)
    assert sized.status_code == 413 and sized.json()["error"]["message"]

    def chunks():
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    streamed = httpx.post(url + route, content=chunks(), timeout=30)  # chunked: no length
    assert streamed.status_code == 413 and "limit" in streamed.json()["error"]["message"]

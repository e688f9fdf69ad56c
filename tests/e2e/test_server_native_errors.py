"""The HTTP server's native (SGLang) API end to end, refusals: bad input gets a JSON error
naming the field and never reaches the engine; the API key guards everything but /health;
bodies over the limit get 413. A second app on the session's engine carries the key and limit.
"""

from __future__ import annotations

import httpx

from tests.support.server import flush, post, server_info, url_fixture

GREEDY = {"temperature": 0, "max_new_tokens": 8}

KEY = "sk-test-key"
guarded_url = url_fixture("guarded_url", api_key=KEY, served_model_name="smol", max_body_bytes=4096)


def _bad_inputs() -> list[tuple[str, object, int, str | None]]:
    cases = [
        ("/generate", b"{not json", 400, "body"),
        ("/generate", b"[1, 2]", 400, "body"),
        ("/generate", {"sampling_params": GREEDY}, 400, "text"),
        ("/generate", {"text": "a", "input_ids": [1, 2]}, 400, "text"),
        ("/generate", {"text": 5}, 400, "text"),
        ("/generate", {"text": "a", "stream": "yes"}, 400, "stream"),
        ("/generate", {"text": []}, 400, "text"),
        ("/generate", {"input_ids": [[]]}, 400, "input_ids"),
        ("/generate", {"input_ids": [10**9]}, 400, "input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"temperature": -1}}, 400, "temperature"),
        (
            "/generate",
            {"text": "a", "sampling_params": {"max_new_tokens": "x"}},
            400,
            "max_new_tokens",
        ),
        ("/generate", {"text": "a", "sampling_params": {"n": 0}}, 400, "n"),
        ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, 400, None),
        ("/generate", {"text": "a", "sampling_params": {"bogus": 1}}, 400, "sampling_params"),
        ("/generate", {"text": "a", "top_logprobs_num": -1}, 400, "top_logprobs_num"),
        ("/generate", {"text": "a", "logprob_start_len": -2}, 400, "logprob_start_len"),
        ("/abort_request", {}, 400, "rid"),
        ("/v1/completions", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/v1/completions", {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"max_tokens": 2}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "temperature": 3},
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "wizard", "content": "a"}]},
            400,
            "messages.0.role",
        ),
        ("/generate", {"text": "a", "sampling_params": {"regex": "(unclosed"}}, 400, "regex"),
        (
            "/generate",
            {"text": "a", "sampling_params": {"json_schema": "{not json"}},
            400,
            "json_schema",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "regex": "[a-"},
            400,
            "regex",
        ),
    ]
    return cases


def test_bad_input_gets_a_json_error_naming_the_field_and_never_reaches_the_engine(url, engine):
    before = flush(url)
    for path, body, status, param in _bad_inputs():
        if isinstance(body, bytes):
            response = httpx.post(
                f"{url}{path}",
                content=body,
                timeout=30,
                headers={"content-type": "application/json"},
            )
        else:
            response = post(url, path, body)
        assert response.status_code == status, (path, body, response.text)
        error = response.json()["error"]
        assert error["message"] and error["type"], error
        if param is not None:
            assert error["param"] == param, (body, error)
    after = server_info(url)
    assert after["pool_used_tokens"] == before["pool_used_tokens"]
    assert after["prompt_tokens_submitted"] == before["prompt_tokens_submitted"]
    good = post(url, "/generate", {"text": "Still fine?", "sampling_params": GREEDY})
    assert good.status_code == 200
    engine.check_integrity()


def test_api_key_guards_everything_but_health(guarded_url):
    assert httpx.get(f"{guarded_url}/health").status_code == 200
    denied = httpx.get(f"{guarded_url}/get_model_info")
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "AuthenticationError"
    wrong = post(guarded_url, "/generate", {"text": "a"}, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{guarded_url}/get_model_info", headers=auth).status_code == 200
    models = httpx.get(f"{guarded_url}/v1/models", headers=auth).json()
    assert models["data"][0]["id"] == "smol"
    ok = post(
        guarded_url,
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 1}},
        headers=auth,
    )
    assert ok.status_code == 200


def test_oversized_bodies_get_413(guarded_url):
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"text": "x" * 8000}
    assert post(guarded_url, "/generate", big, headers=auth).status_code == 413

    def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"text": "'
        for _ in range(8):
            yield b"y" * 1000
        yield b'"}'

    response = httpx.post(f"{guarded_url}/generate", content=chunks(), headers=auth, timeout=30)
    assert response.status_code == 413 and "limit" in response.json()["error"]["message"]

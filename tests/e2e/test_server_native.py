"""The HTTP server's native (SGLang) API end to end: /generate, streaming, cache, admin, errors.

One engine and one real uvicorn server for the module; a second app on the same engine checks
the API key and the body limit. Every scenario ends with the engine idle and its slots whole.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import pytest

from sgl_lite.backend.server import create_app
from tests.e2e import server_fixture as fx
from tests.e2e.server_fixture import flush, serve, server_info, sse_events, wait_idle

pytestmark = pytest.mark.e2e
GREEDY = {"temperature": 0, "max_new_tokens": 8}
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def engine():
    eng = fx.make_engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def url(engine):
    with serve(create_app(engine)) as base:
        yield base


@pytest.fixture(scope="module")
def guarded_url(engine):
    with serve(
        create_app(engine, api_key=KEY, served_model_name="smol", max_body_bytes=4096)
    ) as base:
        yield base


def post(url: str, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120, **kw)


def test_info_endpoints_describe_model_pool_and_health(url):
    assert httpx.get(f"{url}/health").status_code == 200
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(f"{url}{path}").json()
        assert info["is_generation"] is True and info["model_path"] and info["tokenizer_path"]
    for path in ("/get_server_info", "/server_info"):
        info = httpx.get(f"{url}{path}").json()
        assert info["max_total_tokens"] == 8192 and info["schedule_policy"] == "lpm"
        assert info["pool_free_tokens"] + info["pool_used_tokens"] >= 8192
        assert {"cached_tokens", "num_running_reqs", "cache_hit_rate"} <= set(info)
    assert httpx.get(f"{url}/health_generate", timeout=60).json() == {"status": "ok"}
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "default"


def test_generate_single_list_and_n_return_prompts_times_n_results(url, engine):
    one = post(url, "/generate", {"text": "The capital of France is", "sampling_params": GREEDY})
    assert one.status_code == 200, one.text
    result = one.json()
    assert isinstance(result, dict) and result["text"]
    meta = result["meta_info"]
    assert meta["completion_tokens"] == len(result["output_ids"]) <= 8
    assert meta["finish_reason"]["type"] in ("length", "stop") and meta["prompt_tokens"] > 0

    ids = engine.tokenizer.encode("The capital of France is", add_special_tokens=False)
    by_ids = post(url, "/generate", {"input_ids": ids, "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == result["output_ids"]  # greedy: same tokens, cached or not

    many = post(
        url,
        "/generate",
        {
            "text": ["One, two,", "Red, green,"],
            "sampling_params": {**GREEDY, "max_new_tokens": 4, "n": 2},
        },
    )
    assert many.status_code == 200, many.text
    results = many.json()
    assert len(results) == 4
    assert results[0]["output_ids"] == results[1]["output_ids"]  # greedy samples agree
    n_one = post(
        url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "n": 3}}
    ).json()
    assert isinstance(n_one, list) and len(n_one) == 3
    engine.check_integrity()


def test_max_new_tokens_zero_prefills_and_caches_the_prefix(url):
    text = "A prefix that the next request should find in the radix cache, token for token."
    first = post(url, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}}).json()
    assert first["meta_info"]["completion_tokens"] == 0 and first["text"] == ""
    again = post(url, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}}).json()
    assert again["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 1


def test_logprob_fields_are_sglangs(url):
    body = {
        "text": "Paris is the capital of",
        "sampling_params": {**GREEDY, "max_new_tokens": 3},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = post(url, "/generate", body).json()["meta_info"]
    inputs, outputs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] and inputs[0][0] is None
    assert all(
        isinstance(lp, float) and isinstance(t, int) and isinstance(s, str)
        for lp, t, s in inputs[1:] + outputs
    )
    assert len(outputs) == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    assert outputs[0][1] == meta["output_top_logprobs"][0][0][1]  # greedy picks the top token


def test_stream_sends_cumulative_text_and_only_new_logprobs(url):
    body = {"text": "List three fruits:", "sampling_params": GREEDY, "return_logprob": True}
    full = post(url, "/generate", body).json()
    with httpx.stream(
        "POST", f"{url}/generate", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == full["text"]
    streamed = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert [e[1] for e in streamed] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_stream_holds_back_text_that_may_become_a_stop_string(url):
    body = {
        "text": "Count: 1, 2, 3, 4, 5, 6,",
        "sampling_params": {**GREEDY, "max_new_tokens": 12, "stop": [", 9"]},
    }
    full = post(url, "/generate", body).json()
    with httpx.stream(
        "POST", f"{url}/generate", json={**body, "stream": True}, timeout=120
    ) as response:
        texts = [e["text"] for e in sse_events(response.iter_lines()) if e != "[DONE]"]
    assert all(full["text"].startswith(t) for t in texts) and texts[-1] == full["text"]


def test_stop_regex_streams_only_final_text_and_reports_the_match(url):
    body = {
        "text": "Count: 1, 2, 3, 4, 5, 6,",
        "sampling_params": {**GREEDY, "max_new_tokens": 12, "stop_regex": r"\b9\b"},
    }
    full = post(url, "/generate", body).json()
    assert full["meta_info"]["finish_reason"] == {"type": "stop", "matched": "9"}
    assert "9" not in full["text"] and full["text"].rstrip().endswith("8,")
    with httpx.stream(
        "POST", f"{url}/generate", json={**body, "stream": True}, timeout=120
    ) as response:
        texts = [e["text"] for e in sse_events(response.iter_lines()) if e != "[DONE]"]
    assert all(full["text"].startswith(t) for t in texts) and texts[-1] == full["text"]
    bad = post(url, "/generate", {**body, "sampling_params": {"stop_regex": "("}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_regex"


def test_abort_request_ends_a_running_stream(url, engine):
    body = {
        "text": "Tell me a long story.",
        "rid": "abort-me",
        "stream": True,
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True, "temperature": 0},
    }
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as response:
        events = sse_events(response.iter_lines())
        next(events)
        assert post(url, "/abort_request", {"rid": "abort-me"}).json()["running"] is True
        last = [e for e in events if e != "[DONE]"][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 500
    wait_idle(url)
    engine.check_integrity()


def test_client_disconnect_mid_stream_aborts_and_frees_slots(url, engine):
    before = flush(url)
    body = {
        "text": "Write an essay about the sea.",
        "stream": True,
        "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 0},
    }
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as response:
        events = sse_events(response.iter_lines())
        next(events), next(events)
    # leaving the block closed the connection; the request must stop well before 1000 tokens
    info = wait_idle(url, timeout=20)
    assert info["pool_used_tokens"] == info["cached_tokens"]  # nothing held by a request
    after = flush(url)
    assert after["pool_used_tokens"] == before["pool_used_tokens"]
    engine.check_integrity()


def test_client_leaving_a_plain_request_aborts_it(url, engine):
    body = {
        "text": "Write a very long poem.",
        "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 0},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/generate", json=body, timeout=httpx.Timeout(30, read=1.0))
    wait_idle(url, timeout=20)
    engine.check_integrity()


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


def test_64_concurrent_mixed_requests_complete_and_the_pool_returns(url, engine):
    before = flush(url)

    async def one(client: httpx.AsyncClient, i: int) -> str:
        params = {"temperature": 0, "max_new_tokens": 6}
        if i % 4 == 3:
            params["regex"] = r"[0-9]{1,4}"
        text = f"Request number {i}: the answer is"
        if i % 4 == 1:  # streaming
            async with client.stream(
                "POST", "/generate", json={"text": text, "sampling_params": params, "stream": True}
            ) as response:
                assert response.status_code == 200
                lines = [line async for line in response.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            return json.loads(lines[-2][len("data:") :])["meta_info"]["finish_reason"]["type"]
        if i % 4 == 2:  # OpenAI chat
            response = await client.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": 6,
                    "temperature": 0,
                },
            )
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["finish_reason"]
        response = await client.post("/generate", json={"text": text, "sampling_params": params})
        assert response.status_code == 200, response.text
        return response.json()["meta_info"]["finish_reason"]["type"]

    async def main() -> list[str]:
        async with httpx.AsyncClient(
            base_url=url, timeout=300, limits=httpx.Limits(max_connections=100)
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    reasons = asyncio.run(main())
    assert len(reasons) == 64 and set(reasons) <= {"length", "stop"}
    busiest = server_info(url)["max_running_batch_seen"]
    assert busiest > 8  # the requests were batched together, not served one by one
    after = flush(url)
    assert after["pool_used_tokens"] == before["pool_used_tokens"]
    assert after["pool_free_tokens"] == before["pool_free_tokens"]
    engine.check_integrity()


def test_regex_and_json_schema_constrain_native_output(url):
    out = post(
        url,
        "/generate",
        {
            "text": "My favourite number is ",
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "regex": r"[0-9]{1,3}"},
        },
    ).json()
    assert out["text"].isdigit() and len(out["text"]) <= 3
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = post(
        url,
        "/generate",
        {
            "text": "Answer in JSON: ",
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": 16,
                "json_schema": json.dumps(schema),
            },
        },
    ).json()
    assert isinstance(json.loads(out["text"])["ok"], bool)

"""The HTTP server's native (SGLang) API end to end, generation: /generate with one prompt, a
list and n, token ids, prefill-only, logprobs, constraints, and 64 concurrent mixed requests.

The session's engine behind one real uvicorn server for the module (`url_fixture`); streaming,
aborts and disconnects are in test_server_native_stream.py, refusals in
test_server_native_errors.py. Every scenario ends with the engine idle and its slots whole.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.support.server import flush, post, server_info

GREEDY = {"temperature": 0, "max_new_tokens": 8}


def test_info_endpoints_describe_model_pool_and_health(url, engine):
    assert httpx.get(f"{url}/health").status_code == 200
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(f"{url}{path}").json()
        assert info["is_generation"] is True and info["model_path"] and info["tokenizer_path"]
    for path in ("/get_server_info", "/server_info"):
        info = httpx.get(f"{url}{path}").json()
        pool = engine.config.max_total_tokens
        assert info["max_total_tokens"] == pool and info["schedule_policy"] == "lpm"
        assert info["pool_free_tokens"] + info["pool_used_tokens"] >= pool
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

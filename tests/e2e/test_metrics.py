"""`/metrics` end to end: after a few requests every family is there with the model label and
counts that match what was sent (and what each response's meta_info says).

A fresh app on the session engine per test: its counters start at zero, its gauges read the
engine. Names: SGLang's own where SGLang has the family, `sgl_lite:` otherwise.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sgl_lite.server import create_app
from tests.support.server import flush, serve, sse_events

MODEL = "smol-metrics"
GREEDY = {"temperature": 0, "max_new_tokens": 6}
LABEL = {"model_name": MODEL}


@pytest.fixture()
def url(engine):
    assert engine.flush_cache()
    with serve(create_app(engine, served_model_name=MODEL)) as base:
        yield base
    engine.check_integrity()


def scrape(url: str) -> dict[str, dict[frozenset, float]]:
    """Sample name -> {frozenset(label items): value}."""
    response = httpx.get(f"{url}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[frozenset, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[s.name][frozenset(s.labels.items())] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """The one sample of `name` with the model label (and `labels`)."""
    return samples[name][frozenset({**LABEL, **labels}.items())]


def generate(url: str, text: str, **params) -> dict:
    body = {"text": text, "sampling_params": {**GREEDY, **params}}
    response = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


def test_request_families_count_what_was_sent(url):
    metas = [generate(url, "The capital of France is"), generate(url, "One, two, three,")]
    body = {"text": "Streaming counts too:", "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as response:
        events = list(sse_events(response.iter_lines()))
    metas.append(events[-2]["meta_info"])
    completion = httpx.post(
        f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    ).json()["usage"]
    n = 4
    m = scrape(url)

    assert value(m, "sglang:num_requests_total") == n
    assert value(m, "sglang:time_to_first_token_seconds_count") == n
    assert value(m, "sglang:e2e_request_latency_seconds_count") == n
    prompt = sum(x["prompt_tokens"] for x in metas) + completion["prompt_tokens"]
    generated = sum(x["completion_tokens"] for x in metas) + completion["completion_tokens"]
    assert value(m, "sglang:prompt_tokens_total") == prompt
    assert value(m, "sglang:generation_tokens_total") == generated
    # every token after a request's first is one inter-token observation
    assert value(m, "sglang:inter_token_latency_seconds_count") == generated - n
    assert value(m, "sgl_lite:requests_finished_total", finish_reason="length") == n
    ttft_sum = value(m, "sglang:time_to_first_token_seconds_sum")
    assert 0 < ttft_sum <= value(m, "sglang:e2e_request_latency_seconds_sum")
    assert value(m, "sgl_lite:http_requests_total", route="/generate", status="200") == 3
    assert value(m, "sgl_lite:http_requests_total", route="/v1/completions", status="200") == 1


def test_repeated_prompt_shows_cache_hits_in_counters_and_the_gauge(url, engine):
    before = engine.get_server_info()
    prompt = "Tell me a story about a radix tree that shared its prefixes with every request. "
    cold, warm = generate(url, prompt), generate(url, prompt)
    assert cold["cached_tokens"] == 0 and warm["cached_tokens"] > 0
    m = scrape(url)
    assert value(m, "sglang:cached_tokens_total") == warm["cached_tokens"]
    assert value(m, "sglang:prompt_tokens_total") == cold["prompt_tokens"] * 2
    assert value(m, "sglang:cache_hit_rate") > 0
    after = engine.get_server_info()
    hit = after["cache_hit_tokens"] / max(after["prompt_tokens_submitted"], 1)
    assert value(m, "sglang:cache_hit_rate") == pytest.approx(hit)
    assert after["cache_hit_tokens"] > before["cache_hit_tokens"]


def test_queue_and_kv_pool_gauges_read_the_engine(url, engine):
    generate(url, "Fill a few slots of the pool")
    m = scrape(url)
    info = engine.get_server_info()
    total = info["pool_used_tokens"] + info["pool_free_tokens"]
    assert value(m, "sglang:max_total_num_tokens") == total
    assert value(m, "sgl_lite:kv_pool_used_tokens") == info["pool_used_tokens"] > 0
    # idle: every used slot is evictable cache, so SGLang's "used" is zero
    assert value(m, "sglang:num_used_tokens") == 0
    assert value(m, "sglang:token_usage") == 0
    for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sgl_lite:num_queued_reqs"):
        assert value(m, gauge) == 0
    assert value(m, "sgl_lite:radix_cached_tokens") == info["cached_tokens"] > 0


def test_constrained_families_match_meta_info_and_compile_failures(url, engine):
    before = engine.get_server_info()["grammar_compiles"] or {"count": 0}
    word = uuid.uuid4().hex[:6]  # a pattern no earlier test compiled: a build happens
    fine = generate(url, "Answer:", regex=f"(yes|no) {word}", max_new_tokens=16)
    schema = '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}'
    closed = generate(url, "JSON:", json_schema=schema, max_new_tokens=7)
    refused = [  # a regex that does not compile; a schema whose shortest output needs 5 tokens
        {"regex": "(unclosed", "max_new_tokens": 2},
        {"json_schema": schema, "max_new_tokens": 4},
    ]
    for params in refused:
        bad = httpx.post(
            f"{url}/generate", json={"text": "x", "sampling_params": params}, timeout=60
        )
        assert bad.status_code == 400, bad.text
    m = scrape(url)

    assert value(m, "sglang:num_so_requests_total") == 2
    closed_count = int(fine["budget_closed"]) + int(closed["budget_closed"])
    assert value(m, "sgl_lite:budget_closed_total") == closed_count
    violations = [x["constraint_violation"] for x in (fine, closed)]
    assert value(m, "sgl_lite:constraint_violations_total") == sum(
        v is not None for v in violations
    )
    assert value(m, "sglang:num_grammar_aborted_total") == len(refused)
    after = engine.get_server_info()["grammar_compiles"]
    builds = value(m, "sglang:grammar_compilation_time_seconds_count")
    assert builds == after["count"] >= before["count"] + 1
    assert value(m, "sglang:grammar_compilation_time_seconds_sum") > 0
    assert value(m, "sglang:grammar_compilation_time_seconds_bucket", le="+Inf") == builds
    assert value(m, "sgl_lite:grammar_build_failures_total") == after["failures"]


def test_every_family_carries_the_model_label(url):
    generate(url, "Label check")
    flush(url)
    for name, series in scrape(url).items():
        for labels in series:
            assert ("model_name", MODEL) in labels, name

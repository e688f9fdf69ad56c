"""The HTTP server's native (SGLang) API end to end, streaming and ending early: SSE with
cumulative text and only the new logprobs, the hold-back of a possible stop string, stop_regex,
/abort_request, and clients that leave a stream or a plain request (both abort, slots freed).
"""

from __future__ import annotations

import itertools

import httpx
import pytest

from tests.support.server import flush, post, sse_events, wait_idle

GREEDY = {"temperature": 0, "max_new_tokens": 8}


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
    assert full["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\b9\b"}
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

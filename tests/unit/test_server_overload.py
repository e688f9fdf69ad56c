"""Overload and deadlines over HTTP: a full queue answers 503 (native) / 429 (OpenAI) with
Retry-After and counts it in /metrics; a request past its `timeout` ends with an abort reason and
gives its slots back; `timeout: -1` is a 400 naming the field.

The real Engine and server on a slow fake runner (tests/support/fakes.py), so "queued" and
"running too long" are states the test can hold on to without a model.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from tests.support.fakes import ByteTokenizer, SlowRunner
from tests.support.server import flush, serve, server_info

POOL = 2048


@pytest.fixture(scope="module")
def served():
    engine = Engine(
        runner=SlowRunner(0.02, POOL),
        tokenizer=ByteTokenizer(),
        device="cpu",
        max_total_tokens=POOL,
        max_running_requests=1,
        max_queued_requests=2,
    )
    with serve(create_app(engine)) as url:
        yield engine, url
    engine.shutdown()


def params(n: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


def wait_until(url: str, key: str, value: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while server_info(url)[key] != value:
        assert time.monotonic() < deadline, f"{key} never reached {value}"
        time.sleep(0.02)


def assert_nothing_leaked(engine: Engine, url: str) -> None:
    info = flush(url)
    engine.check_integrity()
    assert info["pool_used_tokens"] == 0 and info["num_queued_reqs"] == 0


def test_full_queue_answers_503_and_429_with_retry_after(served):
    engine, url = served
    results: dict[str, httpx.Response] = {}

    def post(name: str, n: int) -> None:
        body = {"text": name, "sampling_params": params(n)}
        results[name] = httpx.post(f"{url}/generate", json=body, timeout=60)

    threads = [threading.Thread(target=post, args=("running", 80))]
    threads[0].start()
    wait_until(url, "num_running_reqs", 1)
    threads += [threading.Thread(target=post, args=(f"queued{i}", 3)) for i in range(2)]
    for t in threads[1:]:
        t.start()
    wait_until(url, "num_queued_reqs", 2)

    native = httpx.post(f"{url}/generate", json={"text": "x", "sampling_params": params(2)})
    assert native.status_code == 503
    assert int(native.headers["retry-after"]) >= 1
    assert "max_queued_requests=2" in native.json()["error"]["message"]
    openai = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert openai.status_code == 429
    assert int(openai.headers["retry-after"]) >= 1
    assert openai.json()["error"]["type"] == "RateLimitError"
    metrics = httpx.get(f"{url}/metrics").text
    assert 'sgl_lite:rejected_requests_total{model_name="default"} 2.0' in metrics

    for t in threads:
        t.join(timeout=60)
    for name, response in results.items():
        assert response.status_code == 200, (name, response.text)
        assert response.json()["meta_info"]["finish_reason"]["type"] == "length"
    assert_nothing_leaked(engine, url)
    # room again: the queue bound is about the present, not a count of the past
    again = httpx.post(f"{url}/generate", json={"text": "x", "sampling_params": params(2)})
    assert again.status_code == 200


def test_request_past_its_timeout_is_aborted_and_frees_its_slots(served):
    engine, url = served
    body = {"text": "slow", "sampling_params": params(1000), "timeout": 0.3}
    out = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert out.status_code == 200, out.text
    meta = out.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "request timed out after 0.3 s"}
    assert 0 < meta["completion_tokens"] < 1000
    assert_nothing_leaked(engine, url)

    body = {"prompt": "slow", "max_tokens": 1000, "ignore_eos": True, "timeout": 0.3}
    out = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert out.status_code == 200, out.text
    assert out.json()["choices"][0]["finish_reason"] == "abort"
    assert_nothing_leaked(engine, url)


def test_streamed_request_past_its_timeout_ends_with_an_abort_chunk(served):
    engine, url = served
    body = {"text": "slow", "sampling_params": params(1000), "timeout": 0.3, "stream": True}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    assert '"type":"abort"' in lines[-2] and "timed out" in lines[-2]
    assert_nothing_leaked(engine, url)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "x", "timeout": -1}),
        ("/generate", {"text": "x", "timeout": "soon"}),
        ("/v1/completions", {"prompt": "x", "timeout": -1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "timeout": 0}),
    ],
)
def test_bad_timeout_is_a_400_naming_the_field(served, path, body):
    _, url = served
    response = httpx.post(f"{url}{path}", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "timeout"


def _fill_queue(url: str) -> list[threading.Thread]:
    """One long request running and two queued: the queue is full until they finish."""

    def post(n: int) -> None:
        httpx.post(f"{url}/generate", json={"text": "q", "sampling_params": params(n)}, timeout=60)

    threads = [threading.Thread(target=post, args=(60,))]
    threads[0].start()
    wait_until(url, "num_running_reqs", 1)
    threads += [threading.Thread(target=post, args=(2,)) for _ in range(2)]
    for t in threads[1:]:
        t.start()
    wait_until(url, "num_queued_reqs", 2)
    return threads


def _rejected(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("sgl_lite:rejected_requests_total{"):
            return float(line.split()[1])
    raise AssertionError("no rejected-requests counter in /metrics")


def test_runtime_endpoint_retries_an_overloaded_server_until_it_has_room(served):
    from sgl_lite.frontend.backends.base import GenRequest, Prompt
    from sgl_lite.frontend.backends.runtime_endpoint import RuntimeEndpoint

    engine, url = served
    patient = RuntimeEndpoint(url, backoff=0.05, overload_retries=20, max_backoff=0.2)
    impatient = RuntimeEndpoint(url, overload_retries=0)
    request = GenRequest(sampling_params=params(3))
    threads = _fill_queue(url)
    before = _rejected(url)
    with pytest.raises(RuntimeError, match="HTTP 503"):
        impatient.generate(Prompt(text="x"), request)
    result = patient.generate(Prompt(text="x"), request)
    assert result.meta_info["completion_tokens"] == 3
    assert _rejected(url) >= before + 2  # the impatient one's refusal and the patient one's
    for t in threads:
        t.join(timeout=60)
    assert_nothing_leaked(engine, url)

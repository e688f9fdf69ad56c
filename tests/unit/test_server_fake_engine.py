"""The server's mapping of engine outcomes to HTTP, against a scripted engine (no model, fast).

A grammar that fails to compile arrives from the engine as a finished output whose abort
reason carries an `InvalidRequest`; the server answers 400 with its message and field (before
any SSE is sent), judging by the error's type. An invalid pattern raises InvalidRequest at
submit (400 naming the field); an engine fault is a 500.
"""

from __future__ import annotations

import time

import httpx
import pytest

from sgl_lite.backend.config import EngineConfig
from tests.support.fakes import ScriptedEngine
from tests.support.server import sse_events


def generate(url: str, regex: str, stream: bool = False) -> httpx.Response:
    return httpx.post(
        f"{url}/generate",
        timeout=30,
        json={"text": "x", "stream": stream, "sampling_params": {"regex": regex}},
    )


def test_grammar_compile_failure_is_a_400_with_its_message(url):
    for stream in (False, True):
        response = generate(url, "slow", stream)
        assert response.status_code == 400
        assert "timed out" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "regex"


def test_invalid_regex_at_submit_is_a_400_naming_regex(url):
    response = generate(url, "bad")
    assert response.status_code == 400 and response.json()["error"]["param"] == "regex"


def test_engine_fault_is_a_500_json_error_and_the_server_keeps_serving(url):
    response = generate(url, "boom")
    assert response.status_code == 500 and "crashed" in response.json()["error"]["message"]
    ok = generate(url, "fine", stream=True)
    events = list(sse_events(ok.iter_lines()))
    assert events[-1] == "[DONE]" and events[-2]["text"] == "ab"


def wait_aborted(engine: ScriptedEngine, rid: str) -> None:
    deadline = time.monotonic() + 10
    while rid not in engine.aborted:
        assert time.monotonic() < deadline, f"{rid} was never aborted"
        time.sleep(0.02)


def test_a_client_leaving_a_plain_request_aborts_it(url, engine):
    body = {"text": "x", "rid": "plain", "sampling_params": {"regex": "hang"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/generate", json=body, timeout=httpx.Timeout(10, read=0.3))
    wait_aborted(engine, "plain")  # on the client's disconnect message


def test_a_client_leaving_a_stream_aborts_it(url, engine):
    body = {"text": "x", "rid": "streamed", "stream": True, "sampling_params": {"regex": "hang"}}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=10) as response:
        assert next(sse_events(response.iter_lines()))["text"] == "a"
    wait_aborted(engine, "streamed")


def test_openai_names_the_fake_model_and_rejects_others(url):
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "fake"
    response = httpx.post(f"{url}/v1/completions", json={"model": "other", "prompt": "x"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": "fake", "prompt": "x", "regex": "slow", "max_tokens": 2},
    )
    assert response.status_code == 400


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_output_that_failed_its_final_check_is_flagged_on_the_openai_routes(url, route, stream):
    """Native /generate reports a failed final check in meta_info; the OpenAI routes carry it
    on the choice (streamed: on the final chunk's), never as a bare `stop`."""
    body = {"model": "fake", "regex": "invalid", "max_tokens": 4, "stream": stream}
    body.update(
        {"prompt": "x"} if "chat" not in route else {"messages": [{"role": "user", "content": "x"}]}
    )
    if not stream:
        choice = httpx.post(f"{url}{route}", json=body, timeout=10).json()["choices"][0]
    else:
        with httpx.stream("POST", f"{url}{route}", json=body, timeout=10) as response:
            events = [e for e in sse_events(response.iter_lines()) if isinstance(e, dict)]
        choice = next(
            c for e in events for c in e.get("choices", []) if c.get("finish_reason") is not None
        )
    assert choice["finish_reason"] == "stop"
    assert choice["constraint_violation"] == "'ab' does not match"


def test_a_response_whose_output_failed_its_final_check_has_failed():
    from sgl_lite.server.openai.responses_output import response_status

    meta = {"finish_reason": {"type": "stop"}, "constraint_violation": "missing 'name'"}
    assert response_status({"meta_info": meta}) == "failed"
    assert response_status({"meta_info": {**meta, "constraint_violation": None}}) == "completed"


def test_cli_flags_become_engine_config_and_bind_loopback_by_default():
    from sgl_lite.server_args import build_parser, engine_kwargs

    args = build_parser().parse_args(
        [
            "--model-path",
            "default",
            "--max-total-tokens",
            "4096",
            "--schedule-policy",
            "fcfs",
            "--disable-radix-cache",
            "--num-threads",
            "2",
            "--served-model-name",
            "smol",
            "--api-key",
            "k",
        ]
    )
    assert args.host == "127.0.0.1" and args.port == 30000 and args.api_key == "k"
    kwargs = engine_kwargs(args)
    config = EngineConfig.from_kwargs(model_path=args.model_path, **kwargs)
    assert (
        config.max_total_tokens,
        config.schedule_policy,
        config.disable_radix_cache,
        config.num_threads,
        config.served_model_name,
    ) == (4096, "fcfs", True, 2, "smol")

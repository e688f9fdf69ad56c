"""Graceful shutdown: `launch_server` gets SIGTERM with requests in flight; the short ones finish,
the one that cannot finish within --shutdown-timeout ends with an abort reason, no new
connection is accepted, and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support import NUM_THREADS
from tests.support.processes import Server, running
from tests.support.server import server_info, sse_events

SHUTDOWN_TIMEOUT = 3.0


@pytest.fixture
def server() -> Iterator[tuple[Server, str]]:
    flags = ["--num-threads", str(NUM_THREADS), "--max-total-tokens", "4096"]
    flags += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--log-level", "warning"]
    with running(*flags) as launched:
        yield launched, launched.url


def test_sigterm_finishes_short_requests_aborts_the_long_one_and_exits_0(server):
    launched, url = server
    proc = launched.proc
    short: list[httpx.Response] = []
    events: list[dict | str] = []
    streaming = threading.Event()

    def post_short() -> None:
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}}
        short.append(httpx.post(f"{url}/generate", json=body, timeout=60))

    def stream_long() -> None:
        params = {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}
        body = {"text": "Count forever:", "sampling_params": params, "stream": True}
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
            for event in sse_events(response.iter_lines()):
                events.append(event)
                streaming.set()

    threads = [threading.Thread(target=stream_long)]
    threads += [threading.Thread(target=post_short) for _ in range(3)]
    threads[0].start()
    assert streaming.wait(60), "the long request never streamed"
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 30
    while True:  # all four are in the engine
        info = server_info(url)
        if info["num_running_reqs"] + info["num_waiting_reqs"] == 4 or short:
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.01)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert proc.wait(timeout=60) == 0, launched.log.read_text()
    took = time.monotonic() - started

    assert len(short) == 3
    for response in short:
        assert response.status_code == 200, response.text
        assert response.json()["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert events[-1] == "[DONE]"
    reason = events[-2]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "shutting down" in reason["message"]
    assert events[-2]["meta_info"]["completion_tokens"] < 3000
    assert SHUTDOWN_TIMEOUT <= took < SHUTDOWN_TIMEOUT + 20
    with pytest.raises(httpx.TransportError):  # nothing listens any more
        httpx.get(f"{url}/health", timeout=2)


def test_sigint_on_an_idle_server_exits_0_at_once(server):
    launched, url = server
    proc = launched.proc
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0, launched.log.read_text()
    assert time.monotonic() - started < 10


def test_overload_and_shutdown_flags_reach_the_engine_and_the_server():
    import uvicorn

    from sgl_lite.server.lifecycle import DrainingServer
    from sgl_lite.server_args import build_parser, engine_kwargs

    flags = ["--max-queued-requests", "8", "--request-timeout", "2.5", "--shutdown-timeout", "4"]
    args = build_parser().parse_args(flags)
    kwargs = engine_kwargs(args)
    assert kwargs["max_queued_requests"] == 8 and kwargs["request_timeout"] == 2.5
    assert args.shutdown_timeout == 4.0
    assert build_parser().parse_args([]).shutdown_timeout == 30.0
    server = DrainingServer(uvicorn.Config(app=None), engine=None, shutdown_timeout=4.0)
    assert server.config.timeout_graceful_shutdown > 4  # room to deliver the aborted answers
    with pytest.raises(ValueError, match="shutdown_timeout"):
        DrainingServer(uvicorn.Config(app=None), engine=None, shutdown_timeout=-1)

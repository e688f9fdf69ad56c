"""Step timeouts in the DSL: `gen(timeout=...)`, `run(timeout=...)`, `run_batch(timeout=...)`.

The timeout travels as `GenRequest.timeout` (never as a sampling param); a step past it fails
the program with `StepTimeout` (a TimeoutError) as `state.error()`, like any failed step. The
RuntimeEndpoint half runs against a stdlib HTTP server scripted per test: it sends the time left
as the request's `timeout` field, bounds the HTTP call and the overload retries by the same
deadline, and reads the server's timed-out abort as StepTimeout.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.backends.base import GenRequest, StepTimeout, timeout_of
from sgl_lite.frontend.backends.engine import _raise_on_abort
from sgl_lite.frontend.backends.runtime_endpoint import RuntimeEndpoint
from sgl_lite.frontend.executor import ProgramError
from tests.support.mock_backend import MockBackend


@sgl.function
def two_steps(s):
    s += "Q:" + sgl.gen("a", max_tokens=4)
    s += " and " + sgl.gen("b", max_tokens=4, timeout=1.5)


def timeouts(backend: MockBackend) -> list[float | None]:
    return [req.timeout for kind, _, req in backend.calls if kind == "generate"]


def test_gen_timeout_is_a_request_option_not_a_sampling_param():
    backend = MockBackend()
    state = two_steps.run(backend=backend)
    assert state.error() is None
    assert timeouts(backend) == [None, 1.5]
    for _, _, req in backend.calls:
        assert "timeout" not in req.sampling_params


def test_run_timeout_bounds_every_gen_and_a_gens_own_wins():
    backend = MockBackend()
    two_steps.run(backend=backend, timeout=7)
    assert timeouts(backend) == [7.0, 1.5]
    batch = MockBackend()
    states = two_steps.run_batch([{}, {}], backend=batch, timeout=3)
    assert all(s.error() is None for s in states)
    assert sorted(timeouts(batch)) == [1.5, 1.5, 3.0, 3.0]


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "5", True])
def test_bad_timeouts_are_refused_naming_where(bad):
    with pytest.raises(ValueError, match=r"gen\(timeout="):
        sgl.gen("x", timeout=bad)
    with pytest.raises(ValueError, match=r"run\(timeout="):
        two_steps.run(backend=MockBackend(), timeout=bad)


def test_a_timed_out_step_fails_its_program_only():
    def reply(text: str, req: GenRequest) -> str:
        if req.timeout is not None and "slow" in text:
            raise StepTimeout(req.timeout, "request timed out after 1.5 s")
        return "ok"

    @sgl.function
    def prog(s, word):
        s += word + sgl.gen("a", max_tokens=2, timeout=1.5)
        s += sgl.gen("b", max_tokens=2)

    backend = MockBackend(reply)
    slow, fast = prog.run_batch([{"word": "slow"}, {"word": "fast"}], backend=backend)
    assert isinstance(slow.error(), sgl.StepTimeout) and isinstance(slow.error(), TimeoutError)
    assert slow.error().seconds == 1.5
    assert fast.error() is None and fast["b"] == "ok"
    assert sum("slow" in text for _, text, _ in backend.calls) == 1  # "b" never ran


# --- RuntimeEndpoint against a scripted server ------------------------------------------------
Handler = Callable[[BaseHTTPRequestHandler, dict], None]


@contextmanager
def scripted_server(on_generate: Handler) -> Iterator[tuple[str, list[dict]]]:
    """A loopback server: /get_model_info answers, /generate calls `on_generate(handler,
    body)`; yields the URL and the bodies /generate received."""
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            reply(self, 200, {"model_path": "scripted"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            on_generate(self, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def reply(handler: BaseHTTPRequestHandler, status: int, body: dict, **headers: str) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in headers.items():
        handler.send_header(k.replace("_", "-"), v)
    handler.end_headers()
    handler.wfile.write(data)


def result(text: str, finish: dict) -> dict:
    meta = {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0, "finish_reason": finish}
    return {"text": text, "meta_info": meta}


@sgl.function
def one_gen(s):
    s += "Q:" + sgl.gen("a", max_tokens=4)


def test_endpoint_sends_the_time_left_and_reads_the_servers_timeout_abort():
    def on_generate(handler, body):
        if "timeout" not in body:
            reply(handler, 200, result("done", {"type": "length", "length": 4}))
            return
        reason = {"type": "abort", "message": f"request timed out after {body['timeout']:g} s"}
        reply(handler, 200, result("par", reason))

    with scripted_server(on_generate) as (url, bodies):
        endpoint = RuntimeEndpoint(url, chat_template="default")
        state = one_gen.run(backend=endpoint, timeout=2)
        assert isinstance(state.error(), StepTimeout)
        assert "timed out" in str(state.error())
        assert 1.5 < bodies[0]["timeout"] <= 2.0
        assert "timeout" not in bodies[0]["sampling_params"]
        # no timeout asked: none sent, and an ordinary answer is an ordinary result
        bodies.clear()
        ok = one_gen.run(backend=endpoint)
        assert ok.error() is None and "timeout" not in bodies[0]


def test_endpoint_stops_waiting_for_a_silent_server_at_the_deadline():
    release = threading.Event()

    def on_generate(handler, body):
        release.wait(10)  # a server that ignores the timeout field and never answers in time

    with scripted_server(on_generate) as (url, _):
        endpoint = RuntimeEndpoint(url, chat_template="default", answer_grace=0.2)
        start = time.monotonic()
        state = one_gen.run(backend=endpoint, timeout=0.3)
        took = time.monotonic() - start
        release.set()
    assert isinstance(state.error(), StepTimeout)
    assert 0.3 <= took < 3


def test_endpoint_does_not_sleep_past_the_deadline_on_an_overloaded_server():
    def on_generate(handler, body):
        reply(handler, 503, {"error": {"message": "overloaded"}}, Retry_After="20")

    with scripted_server(on_generate) as (url, bodies):
        endpoint = RuntimeEndpoint(url, chat_template="default")
        start = time.monotonic()
        state = one_gen.run(backend=endpoint, timeout=1)
        assert time.monotonic() - start < 1
    assert isinstance(state.error(), StepTimeout)
    assert "overloaded (HTTP 503)" in str(state.error())
    assert len(bodies) == 1


def test_endpoint_stream_that_stalls_past_the_deadline_times_out():
    release = threading.Event()

    def on_generate(handler, body):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")  # as uvicorn streams
        handler.end_headers()
        event = f"data: {json.dumps(result('p', None))}\n\n".encode()
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        handler.wfile.flush()
        release.wait(10)  # then nothing more

    @sgl.function
    def streamed(s):
        s += "Q:" + sgl.gen("a", max_tokens=4, timeout=0.3)

    with scripted_server(on_generate) as (url, _):
        endpoint = RuntimeEndpoint(url, chat_template="default", answer_grace=0.2)
        state = streamed.run(backend=endpoint, stream=True)
        pieces = []
        with pytest.raises(ProgramError, match="StepTimeout") as info:  # as any failed step
            for piece in state.text_iter():
                pieces.append(piece)
        release.set()
    assert isinstance(info.value.__cause__, StepTimeout)
    assert isinstance(state.error(), StepTimeout)
    assert pieces == ["Q:", "p"]  # what came before the stall was streamed


def _aborted(message: str) -> dict:
    return {"meta_info": {"finish_reason": {"type": "abort", "message": message}}}


def test_only_the_requests_own_deadline_is_a_step_timeout():
    request = GenRequest(timeout=300.0)
    timed_out = timeout_of(_aborted("request timed out after 300 s")["meta_info"], request)
    assert isinstance(timed_out, StepTimeout) and timed_out.seconds == 300.0
    # A grammar compile that timed out is what expired, not the step's 300 s.
    compile_abort = _aborted("json_schema compile timed out after 5 s; simplify the pattern")
    assert timeout_of(compile_abort["meta_info"], request) is None
    with pytest.raises(RuntimeError, match="json_schema compile timed out after 5 s") as info:
        _raise_on_abort(compile_abort, request)
    assert "300" not in str(info.value)

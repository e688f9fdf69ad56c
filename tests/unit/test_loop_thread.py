"""The engine's loop thread runs only while there is work (backend/engine/loop_thread.py): an idle
engine holds no thread and no OpenMP team, and every call still gets its answer."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.engine.loop_thread import LoopThread
from sgl_lite.backend.errors import EngineError
from tests.support.fakes import ByteTokenizer, FakeRunner, SlowRunner

GREEDY = {"temperature": 0, "max_new_tokens": 4}


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sgl_lite-engine"]


def wait_idle(engine: Engine, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while engine._worker.running and time.monotonic() < deadline:
        time.sleep(0.01)


def make(runner=None) -> Engine:
    config = EngineConfig(max_total_tokens=256, device="cpu")
    return Engine(config, runner=runner or FakeRunner(256), tokenizer=ByteTokenizer())


def test_an_idle_engine_ends_its_loop_thread_and_the_next_request_restarts_it():
    engine = make()
    try:
        first = engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
        wait_idle(engine)
        assert not engine._worker.running
        assert loop_threads() == []
        again = engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
        assert again["output_ids"] == first["output_ids"]
        assert again["meta_info"]["cached_tokens"] > 0  # the state outlived the thread
        wait_idle(engine)
        assert engine.flush_cache() is True  # a call on an idle engine is answered
    finally:
        engine.shutdown()


def test_the_loop_stays_while_requests_run_and_many_callers_all_get_answers():
    engine = make(SlowRunner(delay=0.002))
    try:
        results: list[dict] = []

        def call() -> None:
            for _ in range(5):
                results.append(engine.generate(input_ids=[5, 6], sampling_params=GREEDY))
                time.sleep(0.06)  # past the loop's idle wait: the thread ends and restarts

        callers = [threading.Thread(target=call) for _ in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=60)
        assert len(results) == 20
        assert {tuple(r["output_ids"]) for r in results} == {tuple(results[0]["output_ids"])}
        wait_idle(engine)
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_shutting_down_an_idle_engine_refuses_later_requests_and_answers_calls():
    engine = make()
    engine.generate(input_ids=[1, 2], sampling_params=GREEDY)
    wait_idle(engine)
    engine.shutdown()
    assert loop_threads() == []
    with pytest.raises(EngineError, match="shut down"):
        engine.generate(input_ids=[1, 2], sampling_params=GREEDY)
    assert engine.get_server_info()  # answered, not left waiting on a dead loop


def test_waking_a_running_loop_starts_no_second_thread():
    release, runs = threading.Event(), []
    worker = LoopThread(lambda: (runs.append(1), release.wait(5)), "probe")
    worker.wake()
    worker.wake()  # while the first run blocks
    release.set()
    worker.join(5)
    assert runs == [1]
    assert not worker.running
    worker.wake()  # ended without retiring (as a stopped loop does): a wake starts it anew
    worker.join(5)
    assert runs == [1, 1]


def test_a_loop_thread_that_cannot_take_its_device_stops_the_engine_and_answers_the_caller():
    """A restarted thread sets the CUDA device first; when that fails (here: no CUDA at all),
    the engine stops and the waiting call gets its abort instead of waiting forever."""
    runner = FakeRunner(256)
    engine = make(runner)
    try:
        wait_idle(engine)
        runner.device = torch.device("cuda", 0)  # the next thread must select it, and cannot
        answer: list = []
        call = lambda: answer.append(engine.generate(input_ids=[1, 2], sampling_params=GREEDY))  # noqa: E731
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(timeout=10)
        assert not caller.is_alive(), "the call never returned"
        reason = answer[0]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "shut down" in reason["message"], reason
        with pytest.raises(EngineError, match="shut down"):
            engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
    finally:
        engine.shutdown()

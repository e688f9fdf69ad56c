"""The engine's queue bound and deadlines on a slow fake runner: a full queue refuses new work
(and queues none of it), a request past its timeout ends with an abort and gives its slots back."""

from __future__ import annotations

import time

import pytest

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.engine.admission import Admission
from sgl_lite.backend.errors import InvalidRequest, QueueFull
from tests.support.fakes import ByteTokenizer, SlowRunner

POOL = 2048


def make(delay: float = 0.01, **config) -> Engine:
    return Engine(
        runner=SlowRunner(delay, POOL),
        tokenizer=ByteTokenizer(),
        device="cpu",
        max_total_tokens=POOL,
        **config,
    )


def long_params(n: int = 400) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


def wait_for(cond, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def assert_nothing_leaked(engine: Engine) -> None:
    """Idle, consistent, and every slot is free again once the cache is flushed."""
    wait_for(lambda: engine.get_server_info()["num_running_reqs"] == 0)
    engine.check_integrity()
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["pool_used_tokens"] == 0 and info["num_queued_reqs"] == 0


def test_full_queue_refuses_new_requests_and_queues_none_of_them():
    with make(max_running_requests=1, max_queued_requests=2) as engine:
        first = engine.generate("aaaa", long_params(60), stream=True)
        next(first)  # running: it left the queue
        queued = [engine.generate(p, long_params(5), stream=True) for p in ("bb", "cc")]
        assert engine.get_server_info()["num_queued_reqs"] == 2
        with pytest.raises(QueueFull, match="max_queued_requests=2"):
            engine.generate("dd", long_params(5))
        with pytest.raises(QueueFull):  # a batch that does not fit is refused whole
            engine.generate(["ee"], long_params(5))
        assert engine.get_server_info()["rejected_requests"] == 2
        results = [list(s)[-1] for s in (first, *queued)]
        assert [r["meta_info"]["finish_reason"]["type"] for r in results] == ["length"] * 3
        assert_nothing_leaked(engine)
        # the queue has room again
        assert engine.generate("ff", long_params(3))["meta_info"]["completion_tokens"] == 3


def test_running_request_past_its_timeout_is_aborted_and_frees_its_slots():
    with make() as engine:
        started = time.monotonic()
        out = engine.generate("hello", long_params(), timeout=0.3)
        took = time.monotonic() - started
        reason = out["meta_info"]["finish_reason"]
        assert reason == {"type": "abort", "message": "request timed out after 0.3 s"}
        assert 0 < out["meta_info"]["completion_tokens"] < 400
        assert 0.3 <= took < 3
        assert_nothing_leaked(engine)


def test_waiting_request_past_its_timeout_is_aborted_before_it_runs():
    with make(max_running_requests=1) as engine:
        first = engine.generate("aaaa", long_params(60), stream=True)
        next(first)
        out = engine.generate("bb", long_params(5), timeout=0.1)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["meta_info"]["completion_tokens"] == 0
        assert list(first)[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert_nothing_leaked(engine)


def test_request_timeout_default_applies_and_the_smaller_timeout_wins():
    with make(request_timeout=0.2) as engine:
        out = engine.generate("x", long_params())
        assert out["meta_info"]["finish_reason"]["message"] == "request timed out after 0.2 s"
        out = engine.generate("y", long_params(), timeout=5)  # the server's bound still holds
        assert out["meta_info"]["finish_reason"]["message"] == "request timed out after 0.2 s"
        assert engine.generate("z", long_params(3))["meta_info"]["completion_tokens"] == 3
        assert_nothing_leaked(engine)


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), float("inf"), "5", True])
def test_bad_timeout_is_refused_naming_the_field(bad):
    with make() as engine:
        with pytest.raises(InvalidRequest, match="timeout") as err:
            engine.generate("x", long_params(2), timeout=bad)
        assert err.value.field == "timeout"
        assert engine.get_server_info()["num_queued_reqs"] == 0


@pytest.mark.parametrize(("flag", "value"), [("max_queued_requests", 0), ("request_timeout", -1.0)])
def test_config_bounds_are_checked(flag, value):
    with pytest.raises(ValueError, match=flag):
        make(**{flag: value})


def test_abort_all_ends_every_request_with_the_message():
    with make(max_running_requests=1) as engine:
        streams = [engine.generate(p, long_params(), stream=True) for p in ("aa", "bb")]
        next(streams[0])
        assert engine.abort_all("server shutting down") == 2
        for s in streams:
            reason = list(s)[-1]["meta_info"]["finish_reason"]
            assert reason == {"type": "abort", "message": "server shutting down"}
        assert_nothing_leaked(engine)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Req:
    def __init__(self, rid: str) -> None:
        self.rid = rid


def refused_retry_after(admission: Admission, rid: str = "late") -> int:
    with pytest.raises(QueueFull) as info:
        admission.admit([rid])
    assert f"retry in {info.value.retry_after} s" in str(info.value)
    return info.value.retry_after


def test_retry_after_is_the_time_the_measured_drain_rate_needs_to_make_room():
    clock = FakeClock()
    admission = Admission(max_queued=4, default_timeout=None, clock=clock)
    admission.admit([f"q{i}" for i in range(4)])
    assert refused_retry_after(admission) == 1  # nothing measured yet: the lower bound
    for i in range(2):  # two leave the queue in 4 s: 0.5 requests per second
        clock.now += 2
        admission.started([_Req(f"q{i}")])
    admission.admit(["q4", "q5"])  # full again
    assert admission.drain_rate() == pytest.approx(0.5)
    assert refused_retry_after(admission) == 2  # one place at 0.5/s
    with pytest.raises(QueueFull) as info:  # three places at 0.5/s
        admission.admit(["a", "b", "c"])
    assert info.value.retry_after == 6


def test_retry_after_stays_within_1_and_60_seconds_and_decays_when_the_queue_stalls():
    clock = FakeClock()
    admission = Admission(max_queued=100, default_timeout=None, clock=clock)
    admission.admit([f"q{i}" for i in range(100)])
    for i in range(50):  # a fast queue: 50 requests in 0.5 s
        clock.now += 0.01
        admission.started([_Req(f"q{i}")])
    admission.admit([f"r{i}" for i in range(50)])
    assert refused_retry_after(admission) == 1  # 100/s: well under a second, rounded up to 1
    clock.now += 59  # stalled for 59 s: the measured rate falls to 49 / 59.49 s
    assert admission.drain_rate() == pytest.approx(49 / 59.49)
    assert refused_retry_after(admission) == 2
    with pytest.raises(QueueFull) as info:  # 50 places at 0.82/s: 61 s, capped at a minute
        admission.admit([f"x{i}" for i in range(50)])
    assert info.value.retry_after == 60
    clock.now += 61  # nothing left within the window: no measurement, the lower bound again
    assert admission.drain_rate() is None
    assert refused_retry_after(admission) == 1


def test_a_request_ending_while_queued_counts_as_room_made():
    clock = FakeClock()
    admission = Admission(max_queued=1, default_timeout=None, clock=clock)
    for rid in ("a", "b"):
        admission.admit([rid])
        clock.now += 4
        admission.ended(rid)  # timed out or aborted before it ran
    admission.admit(["c"])
    assert admission.drain_rate() == pytest.approx(1 / 4)
    assert refused_retry_after(admission) == 4

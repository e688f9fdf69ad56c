"""A program that keeps adding steps after one failed: run_batch returns instead of hanging."""

from __future__ import annotations

import threading

import pytest

import sgl_lite as sgl
from tests.support.mock_backend import MockBackend


def test_steps_added_after_a_failure_do_not_hang_the_batch() -> None:
    failed = threading.Event()

    def reply(text, req):
        failed.set()
        raise ValueError("backend down")

    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        assert failed.wait(10)
        s.error()  # wait until the failure is recorded, then keep going as a program would
        s += sgl.gen("b")

    done: list = []
    runner = threading.Thread(
        target=lambda: done.extend(prog.run_batch([{}], backend=MockBackend(reply))), daemon=True
    )
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive(), "run_batch hung on a failed program"
    (state,) = done
    assert isinstance(state.error(), ValueError)
    with pytest.raises(sgl.ProgramError, match="backend down"):
        state["b"]

"""Step timeouts against the real engine, in process and over HTTP: a gen past its timeout
fails its program with StepTimeout, the engine aborts the request and every slot comes back;
a timeout the step meets changes nothing in its output."""

from __future__ import annotations

import time

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.backends.base import StepTimeout
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.backends.runtime_endpoint import RuntimeEndpoint
from sgl_lite.server import create_app
from tests.support.engine_checks import assert_engine_whole
from tests.support.server import serve


@sgl.function
def story(s, length):
    s += "Once upon a time" + sgl.gen("tale", max_tokens=length, temperature=0, ignore_eos=True)


def test_engine_backend_gen_past_its_timeout_fails_and_frees_its_slots(idle_engine):
    backend = EngineBackend(engine=idle_engine)
    start = time.monotonic()
    state = story.run(length=1500, backend=backend, timeout=0.5)
    assert isinstance(state.error(), StepTimeout), state.error()
    assert time.monotonic() - start < 10
    assert "timed out after 0.5 s" in str(state.error())
    assert_engine_whole(idle_engine)
    # a timeout the step meets: the same greedy text as without one
    plain = story.run(length=6, backend=backend)
    bounded = story.run(length=6, backend=backend, timeout=120)
    assert bounded.error() is None and bounded["tale"] == plain["tale"]


def test_runtime_endpoint_timeout_reaches_the_server_which_aborts_the_request(idle_engine):
    with serve(create_app(idle_engine)) as url:
        endpoint = RuntimeEndpoint(url)
        state = story.run(length=1500, backend=endpoint, timeout=0.5)
        assert isinstance(state.error(), StepTimeout), state.error()
        assert "timed out" in str(state.error())  # the server's abort, not the client's read
        assert_engine_whole(idle_engine)
        streamed = story.run(length=1500, backend=endpoint, timeout=0.5, stream=True)
        with pytest.raises(sgl.ProgramError, match="StepTimeout"):
            "".join(streamed.text_iter())
        assert isinstance(streamed.error(), StepTimeout)

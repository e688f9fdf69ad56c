"""Two sgl_lite workers behind SGLang's own router (`sglang-router`, the `cluster` extra).

One router on loopback in front of two single-threaded workers: the DSL and OpenAI requests go
through it, cache-aware routing brings each conversation's later turns back to the worker
holding its prefix, and a worker killed mid-run is routed around.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import sglang_router  # noqa: F401  (the `cluster` extra; `make test` installs it: no skip)

import sgl_lite as sgl
from tests.support.processes import ENV, running_many
from tests.support.server import free_port

WORKER_FLAGS = ("--max-total-tokens", "4096", "--num-threads", "1", "--log-level", "warning")
# The router's defaults check health every 60 s and retry 3 times within 0.25 s. These drop a
# dead worker within seconds (health checks; a circuit breaker that opens after 2 failures) and
# retry the requests that hit it meanwhile with backoff, so none of them fails.
ROUTER_FLAGS = (
    "--policy", "cache_aware",
    "--health-check-interval-secs", "2",
    "--health-failure-threshold", "2",
    "--retry-max-retries", "5",
    "--retry-initial-backoff-ms", "200",
    "--retry-max-backoff-ms", "2000",
    "--cb-failure-threshold", "2",
    "--log-level", "warn",
)  # fmt: skip


@contextlib.contextmanager
def router(*workers: str) -> Iterator[str]:
    """`python -m sglang_router.launch_router` on a free loopback port; yields its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--worker-urls", *workers, *ROUTER_FLAGS]
    cmd += ["--prometheus-port", str(free_port())]  # not the shared default (29000)
    proc = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"router exited {proc.returncode}: {proc.stderr.read()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError("the router did not come up in 60 s")
            time.sleep(0.25)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster():
    """Two workers behind one router: (the router's URL, the workers). The workers start
    together, so their start-ups overlap."""
    with (
        running_many([WORKER_FLAGS, WORKER_FLAGS]) as workers,
        router(*(w.url for w in workers)) as url,
    ):
        yield url, workers


def submitted(worker_url: str) -> int:
    """Prompt tokens the worker has been sent so far."""
    return httpx.get(f"{worker_url}/get_server_info", timeout=30).json()["prompt_tokens_submitted"]


@sgl.function
def conversation(s, persona, questions):
    s += sgl.system(persona)
    for i, q in enumerate(questions):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"a{i}", max_tokens=8, temperature=0))


PERSONAS = [
    f"You are guide number {i} of a museum of {topic}. Speak briefly, in plain words, and always "
    f"mention one object from the {topic} collection that visitors should not miss."
    for i, topic in enumerate(["clocks", "maps", "violins", "kites"])
]


def test_dsl_and_openai_through_the_router(cluster) -> None:
    url, _ = cluster
    backend = sgl.RuntimeEndpoint(url)
    state = conversation.run(persona=PERSONAS[0], questions=["Hello!"], backend=backend)
    assert state.error() is None and state["a0"]
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": "Say hi"}],
              "max_tokens": 4, "temperature": 0},
        timeout=120,
    )  # fmt: skip
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] >= 1


def test_later_turns_hit_the_cache_on_their_worker(cluster) -> None:
    url, workers = cluster
    before = [submitted(w.url) for w in workers]
    questions = ["What is here?", "Which room first?", "Anything for children?"]
    states = conversation.run_batch(
        [{"persona": p, "questions": questions} for p in PERSONAS],
        backend=sgl.RuntimeEndpoint(url),
    )
    for state in states:
        assert state.error() is None
        steps = state.cache_report().steps
        # Turn 3 resends turns 1-2: on the worker that served them, nearly all is cached.
        assert steps[2].hit_rate > 0.8, str(state.cache_report())
    # Both workers took part.
    assert all(submitted(w.url) > b for w, b in zip(workers, before))


def test_a_killed_worker_is_routed_around(cluster) -> None:
    url, workers = cluster
    workers[1].proc.send_signal(signal.SIGKILL)
    workers[1].proc.wait(timeout=10)
    alive_before = submitted(workers[0].url)
    results = []
    for i in range(8):
        response = httpx.post(
            f"{url}/generate",
            json={"text": f"{PERSONAS[i % 4]} Visitor {i}: hello.",
                  "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
            timeout=120,
        )  # fmt: skip
        results.append(response.status_code)
    assert results == [200] * 8
    assert submitted(workers[0].url) > alive_before

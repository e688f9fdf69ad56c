"""SGLang's own frontend (sglang 0.4.10's RuntimeEndpoint) as a client of our server.

Install (two commands: --no-deps is for sglang only):
    pip install --no-deps sglang==0.4.10.post2
    pip install numpy tqdm requests aiohttp pybase64 IPython setproctitle pydantic
"""

from __future__ import annotations

import pytest
import sglang as sgl  # installed by `make setup-dev` (see above)

from tests.support.server import flush, wait_idle


@pytest.fixture(scope="module")
def backend(url):
    return sgl.RuntimeEndpoint(url, chat_template_name="chatml")


@sgl.function
def capital(s, country):
    s += f"Q: What is the capital of {country}?\nA:" + sgl.gen(
        "answer", max_tokens=8, temperature=0, stop="\n"
    )
    s += "\nQ: Is that a city in Europe?\nA: " + sgl.select("europe", choices=["yes", "no"])


@sgl.function
def chat(s, question):
    s += sgl.system("You are brief.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("reply", max_tokens=8, temperature=0))


def test_gen_and_select_run_over_http(backend):
    state = capital.run(country="France", backend=backend)
    assert isinstance(state["answer"], str) and state["answer"]
    assert state["europe"] in ("yes", "no")
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] <= 8 and meta["prompt_tokens"] > 0


def test_select_unconditional_likelihood_meets_sglangs_none_first_entry(backend):
    """SGLang 0.4.10's client does arithmetic on the first input logprob, which SGLang's
    servers (and ours) always send as None, so this method fails against SGLang itself too:
    the error is the client's own, and the default method works on the same program."""

    def pick(method):
        @sgl.function
        def program(s):
            s += "The opposite of hot is " + sgl.select(
                "word", choices=["cold", "warm", "blue"], choices_method=method
            )

        return program

    with pytest.warns(UserWarning, match="NoneType"), pytest.raises(KeyError):
        pick(sgl.unconditional_likelihood_normalized).run(backend=backend)["word"]
    assert pick(sgl.token_length_normalized).run(backend=backend)["word"] in (
        "cold",
        "warm",
        "blue",
    )


def test_batch_and_chat_roles(backend):
    states = capital.run_batch(
        [{"country": "Japan"}, {"country": "Peru"}], backend=backend, num_threads=2
    )
    assert all(s["answer"] for s in states)
    state = chat.run(question="Say hello.", backend=backend)
    assert state["reply"] and "<|im_start|>assistant" in state.text()


def test_streaming_yields_the_same_text(backend):
    plain = capital.run(country="Italy", backend=backend)
    state = capital.run(country="Italy", backend=backend, stream=True)
    pieces = list(state.text_iter("answer"))
    state.sync()
    assert "".join(pieces) == plain["answer"]
    assert state["europe"] == plain["europe"]


def test_flush_cache_and_server_info(backend, engine):
    wait_idle(backend.base_url)
    backend.flush_cache()
    info = backend.get_server_info()
    assert info["pool_used_tokens"] == info["cached_tokens"] == 0
    engine.check_integrity()


def test_regex_and_int_dtype_constrain_the_answer(backend):
    @sgl.function
    def number(s):
        s += "Pick a number between 1 and 100: " + sgl.gen(
            "n", max_tokens=6, temperature=0, regex=r"[1-9][0-9]?"
        )
        s += "\nAnd another: " + sgl.gen("m", max_tokens=6, temperature=0, dtype=int)

    state = number.run(backend=backend)
    assert state["n"].isdigit() and 1 <= int(state["n"]) <= 99
    assert state["m"].lstrip("-").isdigit()


def test_server_stays_consistent(backend, engine):
    url = backend.base_url
    flush(url)
    engine.check_integrity()

"""SGLang 0.5 DSL parity on the mock backend: fork groups, copies, `in`, ret_value, run_batch
and SglFunction (cache, arguments), as SGLang programs rely on them."""

from __future__ import annotations

import pytest

import sgl_lite as sgl
from tests.support.mock_backend import MockBackend


def _requests(backend):
    return [c[2] for c in backend.calls if c[0] == "generate"]


# --- fork groups and copies -----------------------------------------------------------------
def test_item_assignment_on_a_fork_group_adds_to_that_fork():
    @sgl.function
    def prog(s):
        s += "Q:"
        forks = s.fork(2)
        forks[0] += " a" + sgl.gen("x", max_tokens=2)
        forks[1] += " b"
        forks.join()

    backend = MockBackend(lambda text, req: text[-1])
    state = prog.run(backend=backend)
    assert state["x"] == ["a", None]  # only fork 0 set x
    assert [c[1] for c in backend.calls if c[0] == "generate"] == ["Q: a"]


def test_a_fork_group_refuses_a_foreign_state():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(ValueError, match=r"forks\[0\] = \.\.\. can only store fork 0"):
        prog.run(backend=MockBackend())


def test_copy_is_a_with_block_that_joins_back_and_still_a_plain_copy():
    @sgl.function
    def prog(s):
        s += "Q:"
        with s.copy() as c:
            c += " draft" + sgl.gen("draft")
        plain = s.copy()
        plain += " other"
        s += " final"
        return plain.text()

    state = prog.run(backend=MockBackend(lambda text, req: "!"))
    assert state["draft"] == ["!"]  # gathered as SGLang's copy() does (a fork of one)
    assert state.text() == "Q: final"  # the copy's text stays in the copy
    assert state.ret_value == "Q: other"


def test_a_state_that_is_not_a_copy_is_not_a_with_block():
    @sgl.function
    def prog(s):
        with s:
            pass

    with pytest.raises(TypeError, match="only s.copy"):
        prog.run(backend=MockBackend())


def test_join_concate_and_append_under_sglangs_spelling():
    @sgl.function
    def prog(s):
        s += "P"
        forks = s.fork(2)
        forks += lambda i: f"[{i}]" + sgl.gen("y")
        forks.join("concate_and_append")

    state = prog.run(backend=MockBackend(lambda text, req: text[-2]))
    assert state.text() == "P[0]0[1]1"

    with pytest.raises(ValueError, match="concate_and_append"):
        sgl.function(lambda s: s.fork(2).join("concat")).run(backend=MockBackend())


def test_fork_group_src_state_is_the_parent():
    seen = {}

    @sgl.function
    def prog(s):
        forks = s.fork(2)
        seen["same"] = forks.src_state is s

    prog.run(backend=MockBackend())
    assert seen == {"same": True}


# --- reading a state ------------------------------------------------------------------------
def test_contains_waits_for_the_step_that_sets_the_name():
    @sgl.function
    def prog(s):
        s += sgl.gen("x")
        return ("x" in s, "nope" in s, 3 in s)

    state = prog.run(backend=MockBackend(delay=0.05))
    assert state.ret_value == (True, False, False)
    assert "x" in state and "y" not in state


def test_ret_value_from_run_run_batch_and_stream():
    @sgl.function
    def prog(s, k):
        s += sgl.gen("x")
        return s["x"] * k

    backend = MockBackend(lambda text, req: "ab")
    assert prog.run(k=2, backend=backend).ret_value == "abab"
    states = prog.run_batch([{"k": 1}, (3,)], backend=backend)  # dict or positional values
    assert [st.ret_value for st in states] == ["ab", "ababab"]
    streamed = prog.run(k=1, backend=backend, stream=True)
    streamed.sync()
    assert "".join(streamed.text_iter()) == "ab"
    assert streamed.ret_value == "ab"


def test_run_batch_rejects_too_many_positional_values():
    @sgl.function
    def prog(s, k):
        s += str(k)

    with pytest.raises(TypeError, match="has 2 values"):
        prog.run_batch([(1, 2)], backend=MockBackend())


def test_stream_executor_is_refused_with_the_public_replacements():
    state = sgl.function(lambda s: None).run(backend=MockBackend())
    with pytest.raises(NotImplementedError, match=r"s\.text\(\), s\.variables\(\)"):
        state.stream_executor  # noqa: B018


# --- gen(n=k), stop_regex -------------------------------------------------------------------


# --- SglFunction ----------------------------------------------------------------------------
def test_sglfunction_cache_arg_defaults_and_pin_prefix_rid():
    @sgl.function
    def prog(s, q, k=2, *, tone="dry"):
        s += "You are a constant prefix. " + q

    backend = MockBackend()
    assert prog.cache(backend=backend) == "You are a constant prefix. "
    assert backend.calls == [("cache_prefix", "You are a constant prefix. ", None)]
    assert prog.arg_names == ["q", "k", "tone"] and prog.arg_defaults == [2, "dry"]
    assert prog.pin_prefix_rid is None

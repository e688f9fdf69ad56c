"""Interpreter semantics against a mock backend: layering, roles, blocking reads, forks,
scopes, streaming, batches and errors."""

from __future__ import annotations

import asyncio
import threading

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.backends.runtime import Runtime
from tests.support.mock_backend import MockBackend


def _requests(backend):
    return [c[2] for c in backend.calls if c[0] == "generate"]


def test_gen_args_override_run_defaults_which_override_global_defaults():
    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", temperature=0.1, stop=["\n"])
        s += "b" + sgl.gen("y")

    backend = MockBackend()
    prog.run(backend=backend, temperature=0.5, top_k=5)
    first, second = (r.sampling_params for r in _requests(backend))
    assert first["temperature"] == 0.1 and second["temperature"] == 0.5
    assert first["top_k"] == 5 and first["max_new_tokens"] == 128 and first["top_p"] == 1.0
    assert first["stop"] == ["\n", "<|im_end|>"]  # the template's stop string is added
    assert second["stop"] == ["<|im_end|>"]


def test_text_vars_and_meta_info():
    @sgl.function
    def prog(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("answer", max_tokens=4)

    backend = MockBackend(lambda text, req: f" {req.sampling_params['max_new_tokens']}")
    state = prog.run(q="why?", backend=backend)
    assert state["answer"] == " 4"
    assert state.text() == "Q: why?\nA: 4"
    meta = state.get_meta_info("answer")
    assert {"prompt_tokens", "completion_tokens", "cached_tokens"} <= set(meta)
    assert state.error() is None


def test_roles_render_the_template_and_messages():
    @sgl.function
    def chat(s):
        s += sgl.user("hi")
        with s.assistant():
            s += sgl.gen("a")

    backend = MockBackend(template="smollm2")
    state = chat.run(backend=backend)
    sys_prompt = backend.chat_template.default_system_prompt
    assert state.messages() == [
        {"role": "system", "content": sys_prompt},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
    ]
    assert state.text().startswith(f"<|im_start|>system\n{sys_prompt}<|im_end|>\n")
    # gen() saw the prompt right after the assistant prefix
    assert backend.calls[0][1].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_reading_a_variable_blocks_so_python_control_flow_works():
    @sgl.function
    def prog(s):
        s += "Is it raining?" + sgl.gen("yn")
        if s["yn"] == "yes":
            s += " Take an umbrella." + sgl.gen("advice")
        else:
            s += " Enjoy."

    backend = MockBackend(lambda text, req: "yes" if text.endswith("?") else "!", delay=0.02)
    state = prog.run(backend=backend)
    assert state["advice"] == "!"
    assert state.text() == "Is it raining?yes Take an umbrella.!"


def test_fork_prefills_parent_then_join_gathers_variables():
    @sgl.function
    def prog(s):
        s += "Ideas:"
        forks = s.fork(3)
        forks += lambda i: f" #{i}" + sgl.gen("idea")
        forks.join()
        s += " done"

    backend = MockBackend(lambda text, req: text[-2:])
    state = prog.run(backend=backend)
    assert state["idea"] == ["#0", "#1", "#2"]
    assert len(state.get_meta_info("idea")) == 3
    assert backend.kinds()[0] == "cache_prefix" and backend.calls[0][1] == "Ideas:"
    assert state.text() == "Ideas: done"


def test_fork_group_accepts_a_list_and_concate_joined():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        forks += ["a", "b"]
        forks.join(mode="concate_joined")

    assert prog.run(backend=MockBackend()).text() == "ab"


def test_var_scope_copy_and_set_var():
    @sgl.function
    def prog(s):
        with s.var_scope("block"):
            s += "x=" + sgl.gen("x")
        s.set_var("flag", 7)
        c = s.copy()
        c += "more"
        assert c.text().endswith("more") and "more" not in s.text()

    state = prog.run(backend=MockBackend())
    assert state["block"] == "x=ok" and state["flag"] == 7


def test_stream_text_iter_sync_and_async():
    @sgl.function
    def prog(s):
        s += "Say:" + sgl.gen("x")

    backend = MockBackend(lambda text, req: "hello world", delay=0.01)
    state = prog.run(backend=backend, stream=True)
    pieces = list(state.text_iter("x"))
    assert len(pieces) > 1 and "".join(pieces) == "hello world"
    state = prog.run(backend=backend, stream=True)
    assert "".join(state.text_iter()) == "Say:hello world"

    async def consume():
        st = prog.run(backend=backend, stream=True)
        return [p async for p in st.text_async_iter("x")]

    assert "".join(asyncio.run(consume())) == "hello world"


def test_run_batch_keeps_order_runs_concurrently_and_precaches_prefix(capsys):
    @sgl.function
    def prog(s, n):
        s += sgl.system("You count.")
        s += sgl.user("n=" + n)
        s += sgl.assistant(sgl.gen("out"))

    backend = MockBackend(lambda text, req: text.split("n=")[1][:2], delay=0.05)
    states = prog.run_batch(
        [{"n": str(i)} for i in range(10, 18)], backend=backend, progress_bar=True
    )
    assert [s["out"] for s in states] == [str(i) for i in range(10, 18)]
    assert backend.max_in_flight > 1
    kind, text, _ = backend.calls[0]
    assert kind == "cache_prefix"
    assert text == "<|im_start|>system\nYou count.<|im_end|>\n<|im_start|>user\nn="
    assert "run_batch" in capsys.readouterr().err


def test_failing_program_releases_the_batch():
    @sgl.function
    def prog(s, n):
        s += f"n={n}" + sgl.gen("a")
        s += sgl.gen("b")

    def reply(text, req):
        if text.startswith("n=3"):
            raise ValueError("bad request for 3")
        return "x"

    states = prog.run_batch([{"n": i} for i in range(6)], backend=MockBackend(reply))
    for i, state in enumerate(states):
        if i == 3:
            assert isinstance(state.error(), ValueError)
            with pytest.raises(sgl.ProgramError, match="bad request for 3") as info:
                state["b"]
            assert isinstance(info.value.__cause__, ValueError)
        else:
            assert state.error() is None and state["b"] == "x"


def test_error_in_run_raises_from_the_variable_read():
    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        s += "then " + s["a"]

    def reply(text, req):
        raise RuntimeError("engine down")

    with pytest.raises(sgl.ProgramError, match="gen\\('a'\\).*engine down"):
        prog.run(backend=MockBackend(reply))


def test_work_added_after_a_failed_step_is_dropped_instead_of_waited_for():
    def reply(text, req):
        raise RuntimeError("engine down")

    state = sgl.ProgramState(MockBackend(reply))
    state += "x" + sgl.gen("a")
    with pytest.raises(sgl.ProgramError, match="engine down"):
        state["a"]  # the step has failed by now
    state += sgl.gen("b")  # must not leave a queue that nothing will ever run
    done = threading.Event()
    threading.Thread(target=lambda: (state.sync(), done.set()), daemon=True).start()
    assert done.wait(5), "sync() waits for work a failed program will never run"
    assert isinstance(state.error(), RuntimeError)
    with pytest.raises(sgl.ProgramError, match="gen\\('a'\\)"):
        state["b"]


def test_reading_a_variable_that_is_never_set_raises_instead_of_waiting():
    @sgl.function
    def prog(s):
        s += "hi"
        return s["nope"]

    with pytest.raises(KeyError, match="never set"):
        prog.run(backend=MockBackend())


def test_nested_roles_in_a_program_fail_where_written():
    @sgl.function
    def prog(s):
        with s.user(), s.assistant():
            s += "x"

    with pytest.raises(ValueError, match="nested roles"):
        prog.run(backend=MockBackend())


def test_select_passes_the_method_and_records_scores():
    @sgl.function
    def prog(s):
        s += "Pick:" + sgl.select("c", choices=["cat", "dog"])
        s += sgl.gen("g", choices=["x", "y"], choices_method=sgl.greedy_token_selection)

    backend = MockBackend(select_logprobs={"cat": [-2.0], "dog": [-0.1], "x": [-1.0], "y": [-0.5]})
    state = prog.run(backend=backend)
    assert state["c"] == "dog" and state["g"] == "y"
    assert state.get_meta_info("c")["scores"] == [-2.0, -0.1]
    assert state.text() == "Pick:dogy"


def test_run_binds_arguments_and_reports_missing_ones():
    @sgl.function
    def prog(s, a, b):
        s += a + b

    assert prog.bind(a="x").run(b="y", backend=MockBackend()).text() == "xy"
    with pytest.raises(TypeError, match="prog"):
        prog.run(a="x", backend=MockBackend())


def test_trace_finds_the_constant_prefix():
    @sgl.function
    def prog(s, q):
        s += "You are terse. "
        s += "Q: " + q
        s += sgl.gen("a")

    @sgl.function
    def formatted(s, q):
        s += "You are terse. "
        s += f"Q: {q}"  # the f-string needs the value: the trace stops before it

    @sgl.function
    def branching(s, q):
        s += "A"
        if q:
            s += "B"

    backend = MockBackend()
    assert prog.trace(backend=backend) == "You are terse. Q: "
    assert formatted.trace(backend=backend) == "You are terse. "
    assert branching.trace(backend=backend) == "A"


def test_runtime_run_executes_an_anonymous_program():
    runtime = Runtime.__new__(Runtime)
    runtime.backend = MockBackend(lambda text, req: "42")
    state = runtime.run(
        sgl.system("Be brief."), sgl.user("6*7?"), sgl.assistant(sgl.gen("answer", max_tokens=8))
    )
    assert state["answer"] == "42"
    assert state.messages()[-1] == {"role": "assistant", "content": "42"}


@pytest.fixture
def no_default_backend():
    """Clears the default backend and its factory for one test, then puts them back."""
    from sgl_lite.frontend import globals as g

    saved = g.get_default_backend(), g.get_default_backend_factory()
    g.set_default_backend(None)
    yield g
    g.set_default_backend(saved[0])
    g.set_default_backend_factory(saved[1])


def test_reading_the_default_starts_nothing_a_program_starts_it_once(no_default_backend):
    g = no_default_backend
    assert g.get_default_backend_factory() is sgl.Runtime  # registered by `import sgl_lite`
    made = []

    def factory():
        made.append(MockBackend(lambda text, req: "hi", delay=0.05))
        return made[-1]

    g.set_default_backend_factory(factory)
    assert g.get_default_backend() is None and not made

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a")

    threads = [threading.Thread(target=prog.run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and g.get_default_backend() is made[0]
    assert prog.run()["a"] == "hi" and sgl.get_server_info() == {}
    assert len(made) == 1


def test_without_a_default_or_a_factory_a_run_says_how_to_set_one(no_default_backend):
    no_default_backend.set_default_backend_factory(None)

    @sgl.function
    def prog(s):
        s += "x"

    with pytest.raises(RuntimeError, match="set_default_backend"):
        prog.run()

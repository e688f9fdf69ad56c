"""SGLang 0.5 DSL parity on the mock backend: each ProgramState / ProgramStateGroup /
SglFunction behaviour an SGLang program relies on, and the refusals of what sgl_lite lacks."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.backends.base import GenResult
from sgl_lite.frontend.choices import ChoicesDecision, ChoicesSamplingMethod
from tests.unit.test_frontend_mock import MockBackend

PARITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang_parity.md"


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
def test_gen_n_returns_k_alternatives_and_continues_with_the_first():
    counter = itertools.count()

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("x", n=3, temperature=0.7) + " then" + sgl.gen("y")

    backend = MockBackend(lambda text, req: f"<{next(counter)}>" if text == "Q:" else "!")
    state = prog.run(backend=backend)
    alternatives = state["x"]
    assert isinstance(alternatives, list) and len(alternatives) == 3
    assert sorted(alternatives) == ["<0>", "<1>", "<2>"]
    assert state.text() == f"Q:{alternatives[0]} then!"
    prompts = [c[1] for c in backend.calls if c[0] == "generate"]
    assert prompts == ["Q:"] * 3 + [f"Q:{alternatives[0]} then"]
    meta = state.get_meta_info("x")
    assert len(meta["alternatives"]) == 3 and meta["finish_reason"] == {"type": "stop"}
    assert all(r.sampling_params["temperature"] == 0.7 for r in _requests(backend)[:3])


def test_run_n_is_the_default_of_every_gen():
    @sgl.function
    def prog(s):
        s += sgl.gen("a") + sgl.gen("b", n=1)

    state = prog.run(backend=MockBackend(), n=2)
    assert state["a"] == ["ok", "ok"] and state["b"] == "ok"


def test_gen_stop_regex_and_run_defaults():
    @sgl.function
    def prog(s):
        s += sgl.gen("a", stop_regex=r"\d+") + sgl.gen("b") + sgl.gen("c", stop_regex=["x", "y+"])

    backend = MockBackend()
    prog.run(backend=backend, stop_regex="END$")
    a, b, c = (r.sampling_params["stop_regex"] for r in _requests(backend))
    assert (a, b, c) == ([r"\d+"], ["END$"], ["x", "y+"])

    backend = MockBackend()
    prog.run(backend=backend)  # no default: the key is absent where gen set none
    assert ["stop_regex" in r.sampling_params for r in _requests(backend)] == [True, False, True]


@pytest.mark.parametrize(
    "stop_regex, message",
    [("(unclosed", "not a valid regex"), ("a*", "matches the empty string"), ([3], "str")],
)
def test_bad_stop_regex_fails_at_build_time(stop_regex, message):
    with pytest.raises(ValueError, match=message):
        sgl.gen("x", stop_regex=stop_regex)


def test_gen_dtype_takes_the_type_or_its_name():
    assert sgl.gen("x", dtype="int").sampling.dtype is int
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype="list")


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_bad_n_fails_at_build_time(n):
    with pytest.raises(ValueError, match="int >= 1"):
        sgl.gen("x", n=n)


# --- streaming with meta info ---------------------------------------------------------------
def test_text_async_iter_with_meta_data_yields_chunk_meta_pairs():
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("x") + sgl.gen("y")

    backend = MockBackend(lambda text, req: "hello world" if text == "Q:" else "zz")

    async def consume():
        st = prog.run(backend=backend, stream=True)
        return [pair async for pair in st.text_async_iter("x", return_meta_data=True)], st

    pairs, state = asyncio.run(consume())
    assert all(isinstance(p, tuple) and len(p) == 2 for p in pairs) and len(pairs) > 1
    assert "".join(chunk for chunk, _ in pairs) == "hello world" == state["x"]
    assert pairs[-1][1] == state.get_meta_info("x")
    assert pairs[-1][1]["finish_reason"] == {"type": "stop"}

    async def plain():
        st = prog.run(backend=backend, stream=True)
        return [c async for c in st.text_async_iter("y")]

    assert "".join(asyncio.run(plain())) == "zz"


# --- select: SGLang's meta keys and choice methods ------------------------------------------
def test_select_meta_info_carries_sglangs_keys():
    @sgl.function
    def prog(s):
        s += "Pick:" + sgl.select("c", choices=["red", "blue"])

    backend = MockBackend(select_logprobs={"red": [-1.0, -3.0], "blue": [-1.5]})
    meta = prog.run(backend=backend).get_meta_info("c")
    assert meta["normalized_prompt_logprobs"] == [-2.0, -1.5]
    assert meta["input_token_logprobs"] == [
        [[-1.0, None, None], [-3.0, None, None]],
        [[-1.5, None, None]],
    ]
    assert meta["output_token_logprobs"] == [[], []]
    assert meta["decision"] == "blue"


class Longest(ChoicesSamplingMethod):
    """An SGLang-style method: the longest choice, whatever its logprobs."""

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ):
        assert len(normalized_prompt_logprobs) == len(input_token_logprobs) == len(choices)
        best = max(choices, key=len)
        return ChoicesDecision(decision=best, meta_info={"why": "longest"})


class PlainCallable:
    """Not a subclass: SGLang's keyword signature, asking for unconditional logprobs."""

    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None):  # fmt: skip
        self.uncond = unconditional_token_logprobs
        return ChoicesDecision(choices[-1])  # SGLang's meta_info defaults to None


def test_sglang_style_choice_methods_are_accepted():
    @sgl.function
    def prog(s, method):
        s += "Pick:" + sgl.select("c", choices=["a", "bbb", "cc"], choices_method=method)

    backend = MockBackend(select_logprobs={"a": [-0.1], "bbb": [-9.0], "cc": [-5.0]})
    state = prog.run(method=Longest(), backend=backend)
    assert state["c"] == "bbb" and state.text() == "Pick:bbb"
    meta = state.get_meta_info("c")
    assert meta["why"] == "longest" and meta["normalized_prompt_logprobs"] == [-0.1, -9.0, -5.0]

    plain = PlainCallable()
    assert prog.run(method=plain, backend=backend)["c"] == "cc"
    assert plain.uncond == [[[-1.0, None, None]]] * 3  # the mock's unconditional logprobs


def test_a_choice_method_must_decide_among_the_choices():
    class Bad(ChoicesSamplingMethod):
        def __call__(self, **kwargs):
            return ChoicesDecision("nope")

    # NOTE: **kwargs alone is not SGLang's signature, but a ChoicesSamplingMethod subclass is.
    state = sgl.function(
        lambda s: s.__iadd__(sgl.select("c", choices=["a"], choices_method=Bad()))
    ).run(backend=MockBackend())
    assert "must return ChoicesDecision" in str(state.error())
    with pytest.raises(ValueError, match="SGLang-style ChoicesSamplingMethod"):
        sgl.select("c", choices=["a"], choices_method="longest")


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


# --- refusals and the parity table ----------------------------------------------------------
@pytest.mark.parametrize(
    "call, instead",
    [
        (lambda: sgl.image("cat.png"), "text-only"),
        (lambda: sgl.video("cat.mp4", 4), "text-only"),
        (lambda: sgl.separate_reasoning(sgl.gen("x")), "stop='</think>'"),
        (lambda: sgl.Anthropic("claude"), "sgl.OpenAI"),
        (lambda: sgl.LiteLLM("x"), "sgl.OpenAI"),
        (lambda: sgl.VertexAI("x"), "sgl.OpenAI"),
        (lambda: sgl.Crusoe("x"), "sgl.OpenAI"),
        (lambda: sgl.ServerArgs(model_path="m"), "sgl.Runtime"),
        (lambda: setattr(sgl.global_config, "verbosity", 2), "fixed at 0"),
        (lambda: sgl.global_config.no_such_switch, "default_backend"),
    ],
)
def test_refused_names_raise_not_implemented_saying_what_to_use(call, instead):
    with pytest.raises(NotImplementedError, match=re.escape(instead)):
        call()


def test_global_config_default_backend_is_the_default_backend():
    backend = MockBackend()
    sgl.global_config.default_backend = backend
    try:
        assert sgl.global_config.default_backend is backend
        assert sgl.function(lambda s: s.__iadd__(sgl.gen("x"))).run()["x"] == "ok"
        sgl.global_config.verbosity = 0  # the fixed value is accepted
        assert sgl.global_config.enable_parallel_encoding is False
    finally:
        sgl.set_default_backend(None)


# SGLang 0.5's public surface: `sglang.__all__` (the frontend's part), ProgramState,
# ProgramStateGroup and SglFunction. Each must exist here and have a row in the table.
SGLANG_TOP = [
    "Anthropic", "Crusoe", "Engine", "LiteLLM", "OpenAI", "Runtime", "RuntimeEndpoint",
    "ServerArgs", "VertexAI", "__version__", "assistant", "assistant_begin", "assistant_end",
    "flush_cache", "function", "gen", "gen_int", "gen_string", "get_server_info",
    "global_config", "greedy_token_selection", "image", "select", "separate_reasoning",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]  # fmt: skip
SGLANG_STATE = [
    "system", "user", "assistant", "var_scope", "fork", "copy", "text", "messages", "sync",
    "error", "text_iter", "text_async_iter", "get_var", "set_var", "get_meta_info",
    "__iadd__", "__getitem__", "__setitem__", "__contains__", "__repr__", "ret_value",
    "stream_executor",
]  # fmt: skip
SGLANG_GROUP = ["join", "__getitem__", "__setitem__", "__iadd__", "states", "src_state"]
SGLANG_FUNCTION = [
    "bind", "run", "run_batch", "trace", "cache", "__call__", "func", "num_api_spec_tokens",
    "bind_arguments", "pin_prefix_rid", "arg_names", "arg_defaults",
]  # fmt: skip


def test_every_sglang_public_name_exists_and_has_a_row_in_the_parity_table():
    assert all(hasattr(sgl, name) for name in SGLANG_TOP if name != "Engine")
    state = sgl.function(lambda s: None).run(backend=MockBackend())
    assert all(hasattr(type(state), n) or n in vars(state) for n in SGLANG_STATE)
    group = state.fork(2)
    assert all(hasattr(group, n) for n in SGLANG_GROUP)
    func = sgl.function(lambda s: None)
    assert all(hasattr(func, n) for n in SGLANG_FUNCTION)
    doc = PARITY_DOC.read_text()
    rows = set()
    for cell in re.findall(r"^\| (`[^|]+`) \|", doc, flags=re.M):
        names = re.findall(r"`([^`]+)`", cell)  # `X.a` / `b` is X.a and X.b
        owner = names[0].rsplit(".", 1)[0] + "." if "." in names[0] else ""
        rows.update(n if "." in n else owner + n for n in names)
    for prefix, names in [
        ("sgl.", SGLANG_TOP),
        ("ProgramState.", SGLANG_STATE),
        ("ProgramStateGroup.", SGLANG_GROUP),
        ("SglFunction.", SGLANG_FUNCTION),
    ]:
        missing = [n for n in names if not any(r.startswith(prefix + n) for r in rows)]
        assert not missing, f"docs/sglang_parity.md has no row for {prefix}{missing}"


class LogprobStream(MockBackend):
    """Streams one character per token, with cumulative output logprobs as the engine does."""

    def generate_stream(self, prompt, request):
        text = self.reply(prompt.text, request)
        entries = [[-0.5, ord(c), None] for c in text]
        for i in range(1, len(text) + 1):
            meta = {"completion_tokens": i, "output_token_logprobs": entries[:i]}
            yield GenResult(text[:i], meta)
        yield GenResult(text, {**meta, "finish_reason": {"type": "stop"}})


def test_streamed_meta_carries_only_new_logprob_entries_as_sglangs_stream_does():
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("x", return_logprob=True)

    async def consume():
        st = prog.run(backend=LogprobStream(lambda text, req: "abcd"), stream=True)
        return [pair async for pair in st.text_async_iter("x", return_meta_data=True)], st

    pairs, state = asyncio.run(consume())
    assert "".join(c for c, _ in pairs) == "abcd"
    seen = 0
    for chunk, meta in pairs:  # the checks of SGLang's test_stream_logprobs
        assert chunk and meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - seen
        seen = meta["completion_tokens"]
    assert seen == 4 and pairs[-1][1]["finish_reason"] == {"type": "stop"}
    # the variable's own meta info stays cumulative
    assert len(state.get_meta_info("x")["output_token_logprobs"]) == 4

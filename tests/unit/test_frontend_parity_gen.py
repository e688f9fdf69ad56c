"""SGLang 0.5 DSL parity on the mock backend: gen (n, stop_regex, dtype) and select (meta info,
SGLang's choice-method classes)."""

from __future__ import annotations

import itertools

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.choices import ChoicesDecision, ChoicesSamplingMethod
from tests.support.mock_backend import MockBackend


def _requests(backend):
    return [c[2] for c in backend.calls if c[0] == "generate"]


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

"""The DSL's constructors: IR shape, parameter layering, and bad input caught at build time."""

from __future__ import annotations

import dataclasses

import pytest

import sgl_lite as sgl
from sgl_lite.frontend import ir, sampling
from sgl_lite.frontend.chat_template import get_chat_template


def test_ir_nodes_are_frozen_and_keyword_only():
    g = sgl.gen("x", max_tokens=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.name = "y"
    with pytest.raises(TypeError):
        ir.Gen("x")  # positional construction is refused


def test_gen_with_choices_is_a_select_and_concat_flattens():
    s = sgl.gen("c", choices=["a", "b"])
    assert isinstance(s, ir.Select) and s.choices == ("a", "b")
    expr = "Q: " + sgl.gen("x") + "!"
    assert [type(leaf).__name__ for leaf in ir.flatten(expr)] == ["Text", "Gen", "Text"]


def test_gen_int_and_gen_string_set_dtype_and_schema_becomes_a_string():
    assert sgl.gen_int("n").sampling.dtype is int
    assert sgl.gen_string("s").sampling.dtype is str
    assert sgl.gen("j", json_schema={"type": "object"}).sampling.json_schema == '{"type": "object"}'


def test_sampling_layers_gen_over_run_over_global_and_adds_template_stop():
    defaults = sampling.run_defaults({"temperature": 0.3, "max_new_tokens": 16, "top_p": None})
    req = sampling.resolve(
        sgl.gen("x", max_tokens=4, top_k=2, return_logprob=True).sampling,
        defaults,
        get_chat_template("llama-3-instruct"),
    )
    sp = req.sampling_params
    assert sp["max_new_tokens"] == 4 and sp["temperature"] == 0.3 and sp["top_k"] == 2
    assert sp["top_p"] == 1.0 and sp["stop"] == ["<|eot_id|>"]
    assert req.return_logprob and req.logprob_start_len == -1


def test_dtype_becomes_a_regex_and_adds_the_dtype_stops():
    req = sampling.resolve(
        sgl.gen_int("n").sampling, sampling.run_defaults({}), get_chat_template("default")
    )
    assert req.sampling_params["regex"] == r"[-+]?[0-9]{1,19}"
    assert req.sampling_params["stop"] == [" ", "\n"]
    req = sampling.resolve(
        sgl.gen_string("s").sampling, sampling.run_defaults({}), get_chat_template("chatml")
    )
    assert req.sampling_params["regex"] == r"\"[\w\d\s]*\""
    assert req.sampling_params["stop"] == ["<|im_end|>"]  # a str may hold spaces and newlines


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: sgl.gen("x", max_length=5), "did you mean 'max_tokens'"),
        (lambda: sgl.gen("x", regex="(unclosed"), "invalid regex"),
        (lambda: sgl.gen("x", regex=r"(?<=a)b"), "lookbehind cannot be compiled"),
        (lambda: sgl.gen("x", regex=r"(a)\1"), "backreference"),
        (lambda: sgl.gen("x", regex=r"\bword"), "word boundaries"),
        (lambda: sgl.gen("x", regex=3), "must be a string"),
        (lambda: sgl.gen("x", regex="a", json_schema="{}"), "at most one"),
        (lambda: sgl.gen("x", json_schema="{not json"), "not valid JSON"),
        (lambda: sgl.gen("x", dtype=list), "dtype"),
        (lambda: sgl.gen("x", n=0), "must be an int >= 1"),
        (lambda: sgl.gen(5), "variable name"),
        (lambda: sgl.select("x"), "needs choices"),
        (lambda: sgl.select("x", choices=[]), "needs choices"),
        (lambda: sgl.select("x", choices=["a"], temperature=0.7), "temperature"),
        (lambda: sgl.user(sgl.assistant("x")), "nested roles"),
        (lambda: sgl.function(lambda state: None), "first parameter must be `s`"),
    ],
)
def test_bad_input_fails_at_build_time_with_a_fix(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_an_unnamed_gen_cannot_be_used_as_text():
    answer = sgl.gen(max_tokens=4)
    with pytest.raises(TypeError, match="name it"):
        f"{answer}"
    with pytest.raises(TypeError, match="truth value"):
        bool(answer)


def test_function_accepts_num_api_spec_tokens():
    @sgl.function(num_api_spec_tokens=64)
    def prog(s, x):
        s += x

    assert isinstance(prog, sgl.SglFunction) and prog.num_api_spec_tokens == 64
    assert prog.arg_names == ["x"]


def test_unreachable_endpoint_says_how_to_fix():
    with pytest.raises(ConnectionError, match="launch_server"):
        sgl.RuntimeEndpoint("http://127.0.0.1:9", retries=1, backoff=0.01)

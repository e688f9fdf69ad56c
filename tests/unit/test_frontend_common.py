"""sgl_lite.common (the light shared logic) and the frontend's promise to stay light."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

import sgl_lite as sgl
from sgl_lite.common import (
    LOGPROB_OPTION_NAMES,
    OPENAI_SPELLINGS,
    SAMPLING_PARAM_NAMES,
    RegexError,
    common_prefix_len,
    dtype_to_regex,
    validate_regex,
)
from sgl_lite.frontend import ir, sampling
from sgl_lite.frontend.chat_template import get_chat_template
from tests.support.mock_backend import MockBackend


def test_import_sgl_lite_loads_neither_torch_nor_outlines_core():
    # A fresh interpreter: this test process has torch loaded already (conftest).
    # ... and neither does running a constrained program (dtype= once imported the backend).
    code = (
        "import sys, sgl_lite as sgl\n"
        "from sgl_lite.frontend.backends.base import Backend, GenResult\n"
        "from sgl_lite.frontend.chat_template import get_chat_template\n"
        "class Echo(Backend):\n"
        "    chat_template = get_chat_template('chatml')\n"
        "    def generate(self, prompt, request):\n"
        "        return GenResult(request.sampling_params['regex'], {})\n"
        "@sgl.function\n"
        "def prog(s):\n"
        "    s += sgl.user('n?') + sgl.assistant(sgl.gen('n', dtype=int))\n"
        "assert prog.run(backend=Echo())['n'] == '[-+]?[0-9]{1,19}'\n"
        "heavy = [m for m in ('torch', 'outlines_core', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_sgl_engine_is_still_reachable_lazily():
    from sgl_lite.backend.engine import Engine

    assert sgl.Engine is Engine
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sgl.Nope  # noqa: B018


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2
    assert common_prefix_len([7, 8, 9], [0, 7, 8], start=1) == 2  # compares with b[1:]
    assert common_prefix_len([1], [1], start=1) == 0
    assert common_prefix_len("abc", "abd") == 2
    with pytest.raises(ValueError, match="start"):
        common_prefix_len([1], [1], start=-1)


def test_sampling_param_names_are_the_engines_sampling_params_fields():
    from sgl_lite.backend.sampling_params import SamplingParams

    assert tuple(f.name for f in dataclasses.fields(SamplingParams)) == SAMPLING_PARAM_NAMES
    assert not set(SAMPLING_PARAM_NAMES) & set(LOGPROB_OPTION_NAMES)


def test_run_defaults_and_gen_arguments_use_sglangs_names():
    assert set(sampling.RUN_ARGS) <= {*SAMPLING_PARAM_NAMES, *LOGPROB_OPTION_NAMES}
    # gen() spells two of them as OpenAI does and adds dtype.
    renamed = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
    assert renamed == sampling._GEN_TO_RUN
    assert set(OPENAI_SPELLINGS) <= set(SAMPLING_PARAM_NAMES)
    for name in ir.SAMPLING_FIELDS:
        name = renamed.get(name, name)
        assert name in SAMPLING_PARAM_NAMES or name in LOGPROB_OPTION_NAMES or name == "dtype"


def test_a_resolved_gen_request_carries_only_engine_sampling_params():
    args = sgl.gen("x", max_tokens=3, top_k=4, regex="[a-z]", return_logprob=True).sampling
    req = sampling.resolve(args, sampling.run_defaults({}), get_chat_template("default"))
    assert set(req.sampling_params) <= set(SAMPLING_PARAM_NAMES)
    assert req.sampling_params["max_new_tokens"] == 3 and req.return_logprob


def test_dtype_regexes_are_sglangs_with_bounded_digits():
    assert dtype_to_regex(int) == dtype_to_regex("int") == r"[-+]?[0-9]{1,19}"
    assert dtype_to_regex(float) == r"[-+]?([0-9]{1,15}(\.[0-9]{1,6})?|\.[0-9]{1,6})"
    assert dtype_to_regex(bool) == r"(True|False)"
    assert dtype_to_regex(str) == r"\"[\w\d\s]*\""
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtype_to_regex(list)


@pytest.mark.parametrize(
    "make", [lambda: sgl.gen("n", dtype=int), lambda: sgl.gen_int("n")], ids=["dtype", "gen_int"]
)
def test_int_programs_send_a_regex_that_refuses_20_digits(make):
    # through run(): the regex the backend receives in its sampling params (echoed back)
    @sgl.function
    def prog(s):
        s += sgl.user("n?") + sgl.assistant(make())

    backend = MockBackend(lambda text, request: request.sampling_params["regex"])
    regex = prog.run(backend=backend)["n"]
    assert re.fullmatch(regex, "-" + "9" * 19) and re.fullmatch(regex, "0")
    assert not re.fullmatch(regex, "9" * 20)
    assert not re.fullmatch(regex, "+" + "1" * 128)  # SGLang's test_decode_int length


# Patterns with what outlines-core (the engine's automaton builder) does with each.
PATTERNS = {
    r"[a-z]+@x\.(com|org)": True,
    r"(?i)abc": True,
    r"a{2,3}b*?": True,
    r"\d+(\.\d+)?": True,
    r"(?P<x>a)b": True,
    r"[\^$]a\^": True,
    r"ab$": True,
    r"x|": True,
    r"(a)\1": False,  # backreference
    r"(?<=a)b": False,  # lookbehind
    r"a(?=b)": False,  # lookahead
    r"a(?!b)": False,  # negative lookahead
    r"\bword": False,  # word boundary
    r"^ab": False,  # start anchor
    r"a|^b": False,
    r"(?m)^a": False,
    r"\Aab": False,
    r"ab\Z": False,
    r"[a-z": False,  # does not parse
    r"(a": False,
}


@pytest.mark.parametrize("pattern, compiles", PATTERNS.items())
def test_validate_regex_accepts_exactly_what_outlines_core_compiles(pattern, compiles):
    from outlines_core import Index, Vocabulary

    vocab = Vocabulary(500, {chr(c): [c] for c in range(32, 127)})
    try:
        Index(pattern, vocab)
        built = True
    except Exception:
        built = False
    assert built == compiles, "the table above is wrong about outlines-core"
    if compiles:
        validate_regex(pattern)
    else:
        with pytest.raises(RegexError, match="invalid regex"):
            validate_regex(pattern)


def test_validate_regex_names_the_pattern_and_rejects_non_strings():
    with pytest.raises(RegexError, match="json_schema pattern '\\(a':"):
        validate_regex("(a", what="json_schema pattern")
    with pytest.raises(ValueError, match="regex must be a string, got int"):
        validate_regex(3)
    with pytest.raises(ValueError, match="anchor \\^ is not supported"):
        sgl.gen("x", regex="^a")

"""The `ebnf` sampling param, model-free: SamplingParams carries it as the request's constraint,
refuses it beside regex/json_schema (naming the fields, as SGLang's "Only one of regex,
json_schema, or ebnf can be set") or as a non-string, and gen(ebnf=...) resolves to it."""

from __future__ import annotations

import pytest

import sgl_lite as sgl
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import CONSTRAINT_NAMES, SamplingParams
from sgl_lite.common import SAMPLING_PARAM_NAMES
from sgl_lite.frontend import sampling
from sgl_lite.frontend.chat_template import get_chat_template

GRAMMAR = 'root ::= "yes" | "no"'


def test_ebnf_is_the_constraint_and_a_known_param() -> None:
    params = SamplingParams.from_dict({"ebnf": GRAMMAR, "max_new_tokens": 4})
    assert params.constraint == ("ebnf", GRAMMAR)
    assert "ebnf" in SAMPLING_PARAM_NAMES and CONSTRAINT_NAMES == ("regex", "json_schema", "ebnf")
    assert SamplingParams.from_dict({"ebnf": None}).constraint is None


@pytest.mark.parametrize(
    ("given", "first"),
    [
        ({"regex": "a", "ebnf": GRAMMAR}, "regex"),
        ({"json_schema": {"type": "integer"}, "ebnf": GRAMMAR}, "json_schema"),
        ({"regex": "a", "json_schema": "{}", "ebnf": GRAMMAR}, "regex"),
    ],
)
def test_two_constraints_are_refused_naming_them(given: dict, first: str) -> None:
    with pytest.raises(InvalidRequest, match="mutually exclusive") as exc:
        SamplingParams.from_dict(given)
    assert exc.value.field == first
    for name in given:
        assert name in str(exc.value)


def test_a_non_string_grammar_is_refused_naming_ebnf() -> None:
    with pytest.raises(InvalidRequest) as exc:
        SamplingParams.from_dict({"ebnf": {"root": "x"}})
    assert exc.value.field == "ebnf"


def test_gen_ebnf_resolves_to_the_sampling_param() -> None:
    node = sgl.gen("answer", max_tokens=4, ebnf=GRAMMAR)
    req = sampling.resolve(node.sampling, sampling.run_defaults({}), get_chat_template("default"))
    assert req.sampling_params["ebnf"] == GRAMMAR and "regex" not in req.sampling_params
    with pytest.raises(ValueError, match="at most one"):
        sgl.gen("answer", dtype=int, ebnf=GRAMMAR)

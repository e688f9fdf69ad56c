"""The /generate field groups of `server/compat.py` against what the engine implements: every
GenerateInput and SamplingParams field is passed on, none is also a no-op or refused, and the
wire model reads every implemented field."""

from __future__ import annotations

from dataclasses import fields

import pytest

from sgl_lite.backend.engine import GenerateInput
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.server import compat
from sgl_lite.server.protocol import ApiError, GenerateRequest

_WIRE = {"prompt": "text"}  # SGLang's names of GenerateInput's fields, where they differ


def test_every_generate_input_field_is_implemented_and_in_no_other_group():
    engine = {_WIRE.get(f.name, f.name) for f in fields(GenerateInput) if f.init}
    assert engine <= compat.GENERATE_IMPLEMENTED
    implemented = compat.GENERATE_IMPLEMENTED
    assert not implemented & compat.GENERATE_NOOPS
    assert not implemented & set(compat.GENERATE_REFUSED), "implemented and refused"
    assert not compat.GENERATE_NOOPS & set(compat.GENERATE_REFUSED)


def test_every_sampling_params_field_is_implemented_and_in_no_other_group():
    engine = {f.name for f in fields(SamplingParams) if f.init}
    assert engine <= compat.SAMPLING_IMPLEMENTED
    implemented = compat.SAMPLING_IMPLEMENTED
    assert not implemented & compat.SAMPLING_NOOPS
    assert not implemented & set(compat.SAMPLING_REFUSED), "implemented and refused"


def test_the_generate_wire_model_reads_exactly_the_implemented_fields():
    assert set(GenerateRequest.model_fields) == compat.GENERATE_IMPLEMENTED


def test_token_ids_logprob_reaches_the_engine_from_generate():
    body = compat.generate_body({"text": "hi", "return_logprob": True, "token_ids_logprob": [3]})
    inp = GenerateRequest.model_validate(body).to_input()
    assert inp.token_ids_logprob == [3] and inp.return_logprob


def test_sampling_params_the_engine_implements_are_passed_on():
    params = {"ebnf": "root ::= 'a'", "max_new_tokens": 2, "stream_interval": 4}
    assert compat.sampling_params(params, "sampling_params") == {
        "ebnf": "root ::= 'a'",
        "max_new_tokens": 2,
    }
    with pytest.raises(ApiError) as err:
        compat.sampling_params({"beam_width": 4}, "sampling_params")
    assert err.value.param == "sampling_params.beam_width"

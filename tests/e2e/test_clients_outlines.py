"""Outlines 1.x (from .venv-clients) against our server: `from_sglang` (a pydantic model's JSON
Schema, a regex, a choice, a Lark grammar in `ebnf`, a streamed regex), `from_openai` (the model
as a strict `response_format`) and `from_vllm` (vLLM 0.12's `structured_outputs`) each return
text that satisfies the output type (tests/support/clients/outlines_scenario.py)."""

from __future__ import annotations

import json
import re

import pytest

from sgl_lite.server import create_app
from tests.support.client_venv import run_scenario
from tests.support.server import serve

DATE = r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"


@pytest.fixture(scope="module")
def outcome(engine):  # the session's engine
    with serve(create_app(engine)) as url:
        return run_scenario("outlines_scenario.py", url)


def person(result: dict) -> dict:
    """The JSON text Outlines returned, checked against Person's constraints and against the
    instance Outlines' caller parsed from it."""
    value = json.loads(result["text"])
    assert value == result["parsed"]
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and 0 < len(value["name"]) <= 16
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
    return value


@pytest.mark.timeout(360)
def test_from_sglang_json_regex_choice_and_lark(outcome):
    assert outcome["__version__"].startswith("1.")
    assert "Alice" in person(outcome["sglang_json"])["name"]
    assert re.fullmatch(DATE, outcome["sglang_regex"])
    assert outcome["sglang_choice"] in ("yes", "no")
    assert re.fullmatch(r"(yes|no) [0-9]{1,3}", outcome["sglang_lark"]), outcome["sglang_lark"]


@pytest.mark.timeout(360)
def test_from_sglang_streams_the_same_constrained_text(outcome):
    stream = outcome["sglang_regex_stream"]
    assert stream["chunks"] > 1 and stream["text"] == outcome["sglang_regex"]


@pytest.mark.timeout(360)
def test_from_openai_strict_json_schema(outcome):
    assert "Alice" in person(outcome["openai_json"])["name"]


@pytest.mark.timeout(360)
def test_from_vllm_structured_outputs_constrain_as_sglangs_fields_do(outcome):
    # the same constraint through vLLM's `structured_outputs` gives the same greedy text
    assert person(outcome["vllm_json"]) == person(outcome["sglang_json"])
    assert outcome["vllm_regex"] == outcome["sglang_regex"]
    assert outcome["vllm_choice"] == outcome["sglang_choice"]

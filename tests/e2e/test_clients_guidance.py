"""Guidance's SGLang client (`guidance.models.experimental.SglangModel`, from .venv-clients)
against our server: a regex (`extra_body.regex`), a `select` and a template of `gen`s (sent as
llguidance's Lark in `extra_body.ebnf`) and a JSON Schema (strict `response_format`) each come
back satisfying the program (tests/support/clients/guidance_scenario.py)."""

from __future__ import annotations

import json
import re

import pytest

from sgl_lite.server import create_app
from tests.support.client_venv import run_scenario
from tests.support.server import serve


@pytest.fixture(scope="module")
def outcome(engine):  # the session's engine
    with serve(create_app(engine)) as url:
        return run_scenario("guidance_scenario.py", url)


@pytest.mark.timeout(300)
def test_regex_and_select(outcome):
    assert outcome["__version__"].startswith("0.3.")
    assert re.fullmatch(r"20[0-9]{2}", outcome["regex"]), outcome["regex"]
    assert outcome["select"] in ("yes", "no")


@pytest.mark.timeout(300)
def test_a_template_of_gens_is_one_lark_grammar(outcome):
    grammar = outcome["grammar"]
    assert re.fullmatch(r"[A-Z][a-z]{2,9}", grammar["city"]), grammar
    assert re.fullmatch(r"[0-9]{1,3}", grammar["n"]), grammar
    # the captures are read back from the text the server wrote, fixed parts included
    assert grammar["text"].endswith(f"City: {grammar['city']}, n={grammar['n']}"), grammar


@pytest.mark.timeout(300)
def test_json_schema(outcome):
    value = json.loads(outcome["json"])
    assert set(value) == {"city"} and isinstance(value["city"], str)
    assert 0 < len(value["city"]) <= 16

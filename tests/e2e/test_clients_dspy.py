"""DSPy (from .venv-clients) against our server: `dspy.JSONAdapter` predicts a typed signature
through a json_schema `response_format` and gets typed fields back, and its native tool calls
(forced, beside that response_format) come back as a `dspy.ToolCalls` with the right arguments
(tests/support/clients/dspy_scenario.py)."""

from __future__ import annotations

import pytest

from sgl_lite.server import create_app
from tests.support.client_venv import run_scenario
from tests.support.server import serve


@pytest.fixture(scope="module")
def outcome(engine):  # the session's engine
    with serve(create_app(engine)) as url:
        return run_scenario("dspy_scenario.py", url)


@pytest.mark.timeout(300)
def test_json_adapter_returns_typed_fields(outcome):
    assert outcome["__version__"].startswith("3.")
    typed = outcome["typed"]
    # DSPy sent its outputs as a JSON Schema (a pydantic model), not json_object mode
    assert typed["response_format"] == "pydantic model"
    fields = typed["fields"]
    assert typed["types"] == {"name": "str", "age": "int", "adult": "bool", "mood": "str"}
    assert fields["mood"] in ("happy", "sad")
    assert fields["name"] == "Alice" and fields["age"] == 30 and fields["adult"] is True


@pytest.mark.timeout(300)
def test_native_tool_calls_come_back_with_their_arguments(outcome):
    run = outcome["tool_calls"]
    assert run["sent_tools"] == ["get_weather"]
    assert run["calls"] == [{"name": "get_weather", "args": {"city": "Paris"}}]
    assert run["results"] == ["It is 21 degrees Celsius in Paris."]

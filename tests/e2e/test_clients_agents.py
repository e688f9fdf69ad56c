"""pydantic-ai and the OpenAI Agents SDK (from .venv-clients) run agents against our server:
a function tool called with the right arguments and its result used, structured output as a
tool call, as a strict json_schema and as a prompted JSON object (chat and Responses APIs), and
an Agents SDK run streamed over both APIs (tests/support/clients/agents_scenario.py)."""

from __future__ import annotations

import pytest

from sgl_lite.server import create_app
from tests.support.client_venv import run_scenario
from tests.support.server import serve


@pytest.fixture(scope="module")
def outcome(engine):  # the session's engine
    with serve(create_app(engine)) as url:
        return run_scenario("agents_scenario.py", url)


@pytest.mark.timeout(360)
def test_pydantic_ai_calls_the_tool_then_answers_through_the_output_tool(outcome):
    run = outcome["pydantic_ai"]["tool_output"]
    assert run["calls"] == ["Paris"]  # the tool ran once, with the argument the model sent
    names = [call["tool_name"] for call in run["tool_calls"]]
    assert names == ["get_weather", "final_result"]
    assert run["tool_calls"][0]["args"] == {"city": "Paris"}
    # the output tool's arguments validated as Weather; the temperature is the tool's
    assert run["output"] == run["tool_calls"][1]["args"]
    assert run["output"]["city"] == "Paris" and run["output"]["temperature_c"] == 21


@pytest.mark.timeout(360)
def test_pydantic_ai_native_and_prompted_output(outcome):
    runs = outcome["pydantic_ai"]
    assert runs["native_output"] == {"city": "Paris"}  # strict json_schema over chat
    assert runs["responses_native_output"] == {"city": "Paris"}  # and over the Responses API
    # prompted: a JSON object (response_format json_object) parsed into the output type
    assert runs["prompted_output"]["type"] == "Loose"
    assert isinstance(runs["prompted_output"]["value"], dict) and runs["prompted_output"]["value"]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_sdk_streams_a_run_with_a_function_tool(outcome, api):
    run = outcome[f"agents_sdk_{api}"]
    assert run["version"].startswith("0.")
    assert run["calls"] == ["Paris"]
    assert run["item_events"] == ["tool_called", "tool_output", "message_output_created"]
    # the answer arrived as text deltas and is the run's final output; it used the tool's result
    assert "response.output_text.delta" in run["raw_event_types"]
    assert "response.function_call_arguments.delta" in run["raw_event_types"]
    assert run["streamed_text"] == run["final_output"] and "21" in run["final_output"]


@pytest.mark.timeout(360)
def test_agents_sdk_structured_output_after_a_forced_tool(outcome):
    """The first request forces the tool beside the output type's response_format: the tool
    call (a 400 before the server let a forced call stand beside a response_format)."""
    run = outcome["agents_sdk_structured"]
    assert run["calls"] == ["Paris"]
    assert run["final_output"]["city"] == "Paris" and run["final_output"]["temperature_c"] == 21

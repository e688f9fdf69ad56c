"""DSPy against our server, run by .venv-clients' python (tests/e2e/test_clients_dspy.py):
`python dspy_scenario.py URL` declares the server to DSPy as an OpenAI-chat provider that
supports response schemas and function calling (`dspy.lm15.register_provider`, DSPy 3.4's way
to describe a local server: without it DSPy assumes neither and sends no `response_format`),
then with `dspy.JSONAdapter`

- predicts a typed signature (str, int, bool and Literal outputs): DSPy sends the outputs as a
  json_schema `response_format` and parses the JSON into typed fields;
- predicts a signature with `dspy.Tool` inputs and a `dspy.ToolCalls` output, its native tool
  call forced (`tool_choice="required"`, beside the response_format DSPy always sends),

and prints one JSON line: the predictions' fields with their Python types and what DSPy sent.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Literal

import dspy


class Extract(dspy.Signature):
    """Extract the person described in the text."""

    text: str = dspy.InputField()
    name: str = dspy.OutputField(desc="the person's first name")
    age: int = dspy.OutputField(desc="the person's age in years")
    adult: bool = dspy.OutputField(desc="whether the person is 18 or older")
    mood: Literal["happy", "sad"] = dspy.OutputField()


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"It is 21 degrees Celsius in {city}."


class Plan(dspy.Signature):
    """Call the tool that answers the question."""

    question: str = dspy.InputField()
    tools: list[dspy.Tool] = dspy.InputField()
    tool_calls: dspy.ToolCalls = dspy.OutputField()


def main(url: str) -> None:
    """Runs both predictions against `url` and prints the outcome."""
    from dspy.lm15 import (
        AccessPolicy,
        EndpointSupport,
        ModelSupport,
        OpenAIChatCompat,
        ProviderDefinition,
        register_provider,
    )

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    access = AccessPolicy(
        provider="sgllite",
        supports=EndpointSupport(complete=True, stream=True, models=True),
        auth_modes=("bearer",),
        base_url=f"{url}/v1",
    )
    register_provider(
        ProviderDefinition.chat(access, compat=OpenAIChatCompat.preset("sglang")),
        supports=ModelSupport(response_schema=True, function_calling=True),
    )
    lm = dspy.LM(
        "sgllite/default",
        api_key="unused",
        temperature=0.0,
        max_tokens=96,
        cache=False,
        num_retries=0,
    )

    out: dict[str, object] = {"__version__": version("dspy")}
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        pred = dspy.Predict(Extract)(text="Alice is 30 years old and smiles all day.")
        sent = lm.history[-1]["kwargs"].get("response_format")
        fields = {k: pred[k] for k in ("name", "age", "adult", "mood")}
        out["typed"] = {
            "fields": fields,
            "types": {k: type(v).__name__ for k, v in fields.items()},
            "response_format": sent if isinstance(sent, (dict, type(None))) else "pydantic model",
            "raw": lm.history[-1]["outputs"],
        }
        plan = dspy.Predict(Plan)(
            question="What is the weather in Paris?",
            tools=[dspy.Tool(get_weather)],
            config={"tool_choice": "required"},
        )
        calls = plan.tool_calls.tool_calls
        out["tool_calls"] = {
            "calls": [{"name": c.name, "args": c.args} for c in calls],
            "results": [c.execute(functions=[dspy.Tool(get_weather)]) for c in calls],
            "sent_tools": [t["function"]["name"] for t in lm.history[-1]["kwargs"]["tools"]],
        }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])

"""pydantic-ai and the OpenAI Agents SDK against our server, run by .venv-clients' python
(tests/e2e/test_clients_agents.py): `python agents_scenario.py URL` runs

- pydantic-ai agents over the chat API: a function tool with tool output (`ToolOutput`, the
  default for a model output type: every step a tool call, named by `tool_choice`), native output
  (`NativeOutput`: a strict json_schema `response_format`) and prompted output
  (`PromptedOutput`: the schema in the prompt), and native output over the Responses API;
- an Agents SDK agent with a function tool over the chat API and over the Responses API (the
  SDK's default), streamed (`Runner.run_streamed`): its tool forced on the first turn
  (`tool_choice="required"`, which the SDK resets after the call), the tool's result sent back,
  the model's text answer streamed; and one with a structured `output_type` over chat (the
  tool forced beside the output's json_schema `response_format`),

and prints one JSON line: the tools' calls as the tools saw them, the validated outputs, and the
stream's event kinds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from importlib.metadata import version

from pydantic import BaseModel, ConfigDict, Field


class Weather(BaseModel):
    """The agent's answer."""

    city: str = Field(max_length=20)
    temperature_c: int = Field(ge=-50, le=60)


class City(BaseModel):
    """A city named in the text."""

    city: str = Field(max_length=20)


class Loose(BaseModel):
    """Any JSON object: SmolLM2-135M echoes a schema it is only prompted with, so prompted output
    is checked for its plumbing (a JSON object parsed into the output type), not the fields."""

    model_config = ConfigDict(extra="allow")
    city: str | None = None


QUESTION = "What is the weather in Paris? Call get_weather with city Paris."


def pydantic_ai_runs(url: str) -> dict[str, object]:
    """The pydantic-ai agents' outcomes."""
    from pydantic_ai import (
        Agent,
        ModelSettings,
        NativeOutput,
        PromptedOutput,
        RunContext,
        ToolOutput,
        UsageLimits,
    )
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{url}/v1", api_key="unused")
    chat = OpenAIChatModel("default", provider=provider)
    settings: ModelSettings = {"temperature": 0.0, "max_tokens": 64}
    out: dict[str, object] = {"version": version("pydantic-ai-slim")}

    calls: list[str] = []

    def first_the_tool(ctx: RunContext[None]) -> ModelSettings:
        # step 1 must call get_weather, step 2 the output tool: left to choose, a 135M model
        # answers at once, or calls get_weather again and again
        return {**settings, "tool_choice": ["get_weather" if ctx.run_step <= 1 else "final_result"]}

    agent = Agent(chat, output_type=ToolOutput(Weather), model_settings=first_the_tool, retries=1)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in `city`."""
        calls.append(city)
        return f"It is 21 degrees Celsius in {city}."

    result = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=4))
    tool_parts = [
        {"tool_name": part.tool_name, "args": part.args_as_dict()}
        for message in result.all_messages()
        for part in message.parts
        if part.part_kind == "tool-call"
    ]
    out["tool_output"] = {
        "output": result.output.model_dump(),
        "calls": calls,
        "tool_calls": tool_parts,
    }

    native = Agent(chat, output_type=NativeOutput(City), model_settings=settings)
    out["native_output"] = native.run_sync("Which city is the Eiffel Tower in?").output.model_dump()
    prompted = Agent(
        chat, output_type=PromptedOutput(Loose), model_settings={**settings, "max_tokens": 32}
    )
    loose = prompted.run_sync("Which city is the Eiffel Tower in?").output
    out["prompted_output"] = {"type": type(loose).__name__, "value": loose.model_dump()}
    responses = Agent(
        OpenAIResponsesModel("default", provider=provider),
        output_type=NativeOutput(City),
        model_settings=settings,
    )
    out["responses_native_output"] = responses.run_sync(
        "Which city is the Eiffel Tower in?"
    ).output.model_dump()
    return out


async def agents_sdk_run(url: str, api: str) -> dict[str, object]:
    """The Agents SDK agent's streamed run over `api` ("chat" or "responses")."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return f"It is 21 degrees Celsius in {city}."

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = (
        OpenAIChatCompletionsModel(model="default", openai_client=client)
        if api == "chat"
        else OpenAIResponsesModel(model="default", openai_client=client)
    )
    agent = Agent(
        name="weather",
        instructions="You answer weather questions with the get_weather tool.",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(temperature=0.0, max_tokens=64, tool_choice="required"),
        # the default: the tool's result goes back to the model, whose answer ends the run
        # (the SDK resets tool_choice after the call, so the model answers in text)
        tool_use_behavior="run_llm_again",
    )
    run = Runner.run_streamed(agent, QUESTION, max_turns=3)
    events: list[str] = []
    raw: list[str] = []
    text = ""
    async for event in run.stream_events():
        if event.type == "raw_response_event":
            raw.append(event.data.type)
            if event.data.type == "response.output_text.delta":
                text += event.data.delta
        elif event.type == "run_item_stream_event":
            events.append(event.name)
    return {
        "version": version("openai-agents"),
        "calls": calls,
        "final_output": run.final_output,
        "item_events": events,
        "raw_event_types": sorted(set(raw)),
        "raw_events": len(raw),
        "streamed_text": text,
    }


async def agents_sdk_structured(url: str) -> dict[str, object]:
    """An Agents SDK agent with a function tool and a structured `output_type` over the chat
    API: its first request forces the tool beside the output's json_schema `response_format`,
    its second answers in that format with the tool's result."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return f"It is 21 degrees Celsius in {city}."

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="You answer weather questions with the get_weather tool.",
        model=OpenAIChatCompletionsModel(model="default", openai_client=client),
        tools=[get_weather],
        output_type=Weather,
        model_settings=ModelSettings(temperature=0.0, max_tokens=64, tool_choice="required"),
    )
    result = await Runner.run(agent, QUESTION, max_turns=3)
    return {"calls": calls, "final_output": result.final_output.model_dump()}


def main(url: str) -> None:
    """Runs both clients' scenarios against `url` and prints the outcomes."""
    start = time.monotonic()
    out: dict[str, object] = {"pydantic_ai": pydantic_ai_runs(url)}
    seconds = {"pydantic_ai": time.monotonic() - start}
    for api in ("chat", "responses"):
        start = time.monotonic()
        out[f"agents_sdk_{api}"] = asyncio.run(agents_sdk_run(url, api))
        seconds[f"agents_sdk_{api}"] = time.monotonic() - start
    start = time.monotonic()
    out["agents_sdk_structured"] = asyncio.run(agents_sdk_structured(url))
    seconds["agents_sdk_structured"] = time.monotonic() - start
    out["seconds"] = seconds
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

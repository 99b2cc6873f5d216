"""An OpenAI Agents SDK agent with a function tool, against `baton serve` on the embedded model.

The agent must call the tool (tool_choice required, which the grammar enforces on the random
model) with arguments its schema accepts, and stop on the tool's result."""
from __future__ import annotations

import asyncio

import openai
from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)

from tests.responses.conftest import MODEL

ZONES = ("UTC", "CET")


def test_an_agent_calls_its_function_tool(stack):
    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    calls: list[tuple[str, int]] = []

    @function_tool
    def clock(zone: str, hour: int) -> str:
        """Sets the clock of a time zone to an hour."""
        calls.append((zone, hour))
        return f"set {zone} to {hour}"

    client = openai.AsyncOpenAI(base_url=stack.url, api_key="sk-alpha", max_retries=0,
                                timeout=120)
    agent = Agent(name="clockmaker", instructions="Set the clock.", tools=[clock],
                  model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", max_tokens=200),
                  tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(Runner.run(agent, "Set the clock to noon UTC."))
    [(zone, hour)] = calls
    assert isinstance(zone, str) and isinstance(hour, int)
    assert result.final_output == f"set {zone} to {hour}"
    # the model's call went through the Responses API, stored like any other response
    [raw] = result.raw_responses
    assert raw.response_id.startswith("resp_")

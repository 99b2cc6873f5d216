"""LangChain's ChatOpenAI against the whole stack: forced tool calls through bind_tools, and typed
answers through with_structured_output, whose fields the random-weight model can only get right
under the grammar."""
from __future__ import annotations

from typing import Literal

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """Forecast for a city."""
    city: Literal["Paris", "Oslo", "Lima"]
    days: int = Field(ge=1, le=7)
    metric: bool


class Place(BaseModel):
    label: str = Field(max_length=6)
    lat: int = Field(ge=-90, le=90)


class Trip(BaseModel):
    """A planned trip."""
    destination: Place
    nights: int = Field(ge=1, le=30)
    mode: Literal["train", "plane"]


PROMPT = "Plan my trip and check the weather."


@pytest.fixture
def llm(stack, api_key, model):
    return ChatOpenAI(base_url=stack.url, api_key=api_key, model=model.name, max_tokens=300,
                      temperature=1.0, seed=0, max_retries=0)


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_bind_tools_forced_call_has_valid_args(llm, tool_choice):
    message = llm.bind_tools([GetWeather, Trip], tool_choice=tool_choice,
                             parallel_tool_calls=False).invoke(PROMPT)
    assert len(message.tool_calls) == 1 and not message.invalid_tool_calls
    call = message.tool_calls[0]
    assert tool_choice == "any" or call["name"] == "GetWeather"
    {"GetWeather": GetWeather, "Trip": Trip}[call["name"]].model_validate(call["args"])
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_bind_tools_streamed_call_has_valid_args(llm):
    chunks = list(llm.bind_tools([GetWeather], tool_choice="GetWeather").stream(PROMPT))
    message = sum(chunks[1:], chunks[0])
    assert isinstance(message, AIMessageChunk) and len(message.tool_calls) == 1
    GetWeather.model_validate(message.tool_calls[0]["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_a_valid_instance(llm, method):
    trip = llm.with_structured_output(Trip, method=method).invoke(PROMPT)
    assert isinstance(trip, Trip)  # LangChain validated it

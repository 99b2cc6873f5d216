"""Tool calling through the whole stack, in both modes, with the official `openai` client.

The model has random weights, so arguments that parse and validate against the parameters schema on
every forced call can only come from the grammar the gateway puts on a `required` or named
tool_choice."""
from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "where": {
            "type": "object", "properties": {
                "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                "label": {"type": "string", "maxLength": 5}
            }, "required": ["lat", "label"], "additionalProperties": False
        },
        "hours": {
            "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23},
            "minItems": 1, "maxItems": 3
        },
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "where", "hours", "metric"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{
    "type": "function", "function": {
        "name": "get_weather", "description": "Forecast for a city", "parameters": WEATHER,
        "strict": True
    }
}, {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = [("required", None),
          ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
          ({"type": "function", "function": {"name": "get_time"}}, "get_time")]


def _kwargs(model, tool_choice, seed: int, **extra) -> dict:
    return {"model": model.name, "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice,
            "max_tokens": 300, "temperature": 1.0, "seed": seed, **extra}


def check_calls(calls: list[tuple[str, str]], name: str | None, parallel: bool = False) -> None:
    """Every call names a tool (the forced one, if named) and its arguments validate against that
    tool's schema."""
    assert calls and (parallel or len(calls) == 1)
    for called, arguments in calls:
        assert called in SCHEMAS and (name is None or called == name)
        jsonschema.validate(json.loads(arguments), SCHEMAS[called])


def from_stream(chunks) -> tuple[list[tuple[str, str]], str | None, str]:
    """(name, arguments) per streamed call, the finish reason, and the streamed content."""
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id is not None:
                assert call.type == "function" and call.index not in calls
                calls[call.index] = [call.function.name, ""]
            calls[call.index][1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish, content


@pytest.mark.parametrize("tool_choice,name", FORCED)
def test_forced_calls_validate(client, model, tool_choice, name):
    for seed in range(3):
        response = client.chat.completions.create(
            **_kwargs(model, tool_choice, seed, parallel_tool_calls=False))
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = choice.message.tool_calls
        assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
        check_calls([(c.function.name, c.function.arguments) for c in calls], name)


@pytest.mark.parametrize("tool_choice,name", FORCED)
def test_forced_calls_stream_as_deltas(client, model, tool_choice, name):
    kwargs = _kwargs(model, tool_choice, 7, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    calls, finish, content = from_stream(client.chat.completions.create(**kwargs, stream=True))
    assert finish == "tool_calls" and content == ""
    check_calls(calls, name)
    assert calls == [(c.function.name, c.function.arguments) for c in whole]  # same seed, same call


def test_parallel_calls_each_validate(client, model):
    counts = []
    for seed in range(3):
        # Nothing bounds how many calls a random model makes in parallel, hence the budget.
        response = client.chat.completions.create(
            **_kwargs(model, "required", seed, max_tokens=800))
        assert response.choices[0].finish_reason == "tool_calls"
        calls = response.choices[0].message.tool_calls
        check_calls([(c.function.name, c.function.arguments) for c in calls], None, parallel=True)
        counts.append(len(calls))
    assert max(counts) > 1


def test_async_client_streamed_and_not(async_client, model):
    async def run() -> None:
        named = {"type": "function", "function": {"name": "get_weather"}}
        requests = [
            async_client.chat.completions.create(
                **_kwargs(model, choice, seed, parallel_tool_calls=False)) for seed in range(2)
            for choice in ("required", named)
        ]
        for response in await asyncio.gather(*requests):
            message = response.choices[0].message
            check_calls([(c.function.name, c.function.arguments) for c in message.tool_calls], None)
        stream = await async_client.chat.completions.create(**_kwargs(model, named, 3), stream=True)
        calls, finish, _ = from_stream([chunk async for chunk in stream])
        assert finish == "tool_calls"
        check_calls(calls, "get_weather")

    asyncio.run(run())


def test_history_with_tool_calls_and_results(client, model):
    """A second turn: the assistant's call and the tool's result are rendered into the prompt and
    answered."""
    first = client.chat.completions.create(
        **_kwargs(model, "required", 1, parallel_tool_calls=False))
    call = first.choices[0].message.tool_calls[0]
    history = [
        *MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})}
    ]
    again = client.chat.completions.create(model=model.name, messages=history, tools=TOOLS,
                                           max_tokens=8, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert again.usage.prompt_tokens > first.usage.prompt_tokens + len(call.function.arguments) // 4
    forced = client.chat.completions.create(**_kwargs(model, "required", 2, messages=history,
                                                      parallel_tool_calls=False))
    check_calls([(c.function.name, c.function.arguments)
                 for c in forced.choices[0].message.tool_calls], None)


def test_auto_and_none_answer_with_text_or_parsed_calls(client, model):
    for tool_choice in ("auto", "none"):
        response = client.chat.completions.create(**_kwargs(model, tool_choice, 0, max_tokens=16))
        choice = response.choices[0]
        # a random model rarely writes a well-formed <tool_call> block
        if choice.message.tool_calls:
            assert tool_choice == "auto" and choice.finish_reason == "tool_calls"
        else:
            assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_bad_tool_choice_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model.name, messages=MESSAGES, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.body["param"] == "tool_choice"


def test_auto_choice_parses_the_models_tool_call_streamed_and_not(client, model):
    """Auto choices are parsed from free text; a grammar (not the tool machinery) makes the random
    model write a Hermes-style call after some text, so the parser and its streamed deltas run on
    real token boundaries."""
    call = {"type": "object", "properties": {"name": {"const": "get_time"}, "arguments": TIME},
            "required": ["name", "arguments"], "additionalProperties": False}
    grammar = ('start: "Checking.\\n<tool_call>\\n" call "\\n</tool_call>"\ncall: %json '
               + json.dumps(call))
    kwargs = _kwargs(model, "auto", 5, extra_body={"structured_outputs": {"grammar": grammar}})
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking.\n"
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    check_calls(whole, "get_time")
    calls, finish, content = from_stream(client.chat.completions.create(**kwargs, stream=True))
    assert (calls, finish, content) == (whole, "tool_calls", "Checking.\n")


class Alarm(BaseModel):
    """Sets an alarm."""
    hour: int = Field(ge=0, le=23)
    zone: Literal["UTC", "CET"]
    repeat: list[Literal["mon", "tue"]] = Field(max_length=2)


def test_strict_pydantic_tool_parses(client, model):
    """The openai client's own strict-tool path: it parses the arguments into the model it built the
    tool from."""
    completion = client.chat.completions.parse(
        model=model.name, messages=MESSAGES, tools=[openai.pydantic_function_tool(Alarm)],
        max_tokens=200, seed=0, tool_choice={"type": "function", "function": {"name": "Alarm"}})
    call = completion.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Alarm)

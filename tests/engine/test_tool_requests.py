"""Tool fields of chat requests: validation, rendering by the chat template, the grammar of forced
choices, and tool calls in the response body."""
from __future__ import annotations

import json

import jsonschema
import pytest
from transformers import AutoTokenizer

from baton.services.common.outputs import RequestOutput
from baton.services.openai.endpoints import parse_request
from baton.services.openai.engine_input import to_engine_input
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import Choice, build_response
from baton.services.openai.tool_parsers import HermesParser

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}
    }, "required": ["city", "days"], "additionalProperties": False
}
TOOLS = [{
    "type": "function",
    "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}
}, {"type": "function", "function": {"name": "get_time"}}]
HISTORY = USER + [{
    "role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}
    }]
}, {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
                  {"role": "user", "content": "And tomorrow?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])


def engine_input(tokenizer, **body):
    return to_engine_input(parse_request(CHAT, {"messages": USER, **body}), tokenizer, 2048)


def test_history_with_tool_calls_and_results_is_rendered(tokenizer):
    inp = engine_input(tokenizer, messages=HISTORY, tools=TOOLS)
    prompt = tokenizer.decode(inp.prompts[0])
    # the signatures, in the system turn
    assert '"name": "get_weather"' in prompt.split("<|im_end|>")[0]
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in prompt
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt
    assert prompt.endswith("And tomorrow?<|im_end|>\n<|im_start|>assistant\n")
    assert inp.params.structured_output is None  # auto: free text, parsed afterwards


def test_named_choice_is_constrained_to_the_functions_arguments(tokenizer):
    inp = engine_input(tokenizer, tools=TOOLS,
                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert inp.params.structured_output.kind == "json_schema"
    assert json.loads(inp.params.structured_output.value) == WEATHER
    none = engine_input(tokenizer, tools=TOOLS,
                        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert json.loads(none.params.structured_output.value)["additionalProperties"] is False


@pytest.mark.parametrize("parallel", [True, False])
def test_required_choice_is_an_array_of_calls(tokenizer, parallel):
    inp = engine_input(tokenizer, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    schema = json.loads(inp.params.structured_output.value)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    one = [{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}]
    assert validator.is_valid(one) and validator.is_valid([{"name": "get_time", "arguments": {}}])
    assert validator.is_valid(one * 2) == parallel
    assert not validator.is_valid([]) and not validator.is_valid(
        [{"name": "get_time", "arguments": {"x": 1}}])
    assert not validator.is_valid(
        [{"name": "get_weather", "arguments": {"city": "Rome", "days": 9}}])


@pytest.mark.parametrize("body,param,fragment", [
    ({"tools": [{"type": "function", "function": {"parameters": WEATHER}}]
      }, "tools[0].function.name", "required"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]
      }, "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
      }, "tools[0].function.parameters", "not a valid JSON schema"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "'function'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
      }, "tools[0].function.parameters", "must describe an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$schema": []}}}]
      }, "tools[0].function.parameters", "$schema must be a string"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}
      }, "tool_choice", "`nope`"),
    ({"tool_choice": "required"}, "tool_choice", "requires tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}
      }, "tool_choice", "requires tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'auto'"),
    ({"tools": [TOOLS[1], TOOLS[0], TOOLS[1]]}, "tools", "`get_time` is given more than once"),
    ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages[1]", "tool_call_id"),
    ({
        "messages": [{
            "role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]
        }]
    }, "messages[0].tool_calls[0].function", "required"),
])
def test_bad_tool_input_is_refused(tokenizer, body, param, fragment):
    with pytest.raises(ProtocolError) as info:
        engine_input(tokenizer, **body)
    assert (info.value.status, info.value.param) == (400, param)
    assert fragment in info.value.message


def _output(text: str, finish_reason: str = "stop") -> Choice:
    out = RequestOutput(request_id="r", prompt_token_ids=[1], token_ids=[5, 6], text=text,
                        num_new_tokens=2, new_text="", finished=True, finish_reason=finish_reason)
    return Choice.of(out)


@pytest.mark.parametrize("tool_choice,text,calls", [
    ({"type": "function", "function": {"name": "get_weather"}
      }, '{"city": "Oslo", "days": 1}', [("get_weather", {"city": "Oslo", "days": 1})]),
    ("required", '[{"name": "get_time", "arguments": {}}]', [("get_time", {})]),
    ("auto", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', [("get_time", {})
                                                                                  ]),
    ("auto", "Just text.", []),
    ("none", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', []),
])
def test_response_carries_tool_calls(tokenizer, tool_choice, text, calls):
    request = parse_request(CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": tool_choice})
    choice = build_response(request, [_output(text)], tokenizer, "tiny",
                            tool_parser=HermesParser())["choices"][0]
    message = choice["message"]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in message.get("tool_calls", [])]
    assert got == calls
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop")
    assert message["content"] == (None if calls else text)


def test_truncated_forced_call_is_content_with_finish_length(tokenizer):
    request = parse_request(CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": "required"})
    choice = build_response(request, [_output('[{"name": "get_ti', "length")], tokenizer,
                            "tiny")["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]


def test_forced_schemas_are_closed_where_they_say_nothing(tokenizer):
    open_schema = {
        "type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}}, "c": {
                "type": "array",
                "items": {"anyOf": [{"type": "object", "properties": {"d": {"type": "null"}}}]}
            },
            "e": {"type": "object", "properties": {},
                  "additionalProperties": {"type": "integer"}}, "properties": {"type": "string"}
        }
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": open_schema}}]
    inp = engine_input(tokenizer, tools=tools,
                       tool_choice={"type": "function", "function": {"name": "f"}})
    closed = json.loads(inp.params.structured_output.value)
    assert closed["additionalProperties"] is False and closed["properties"]["a"][
        "additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["anyOf"][0]["additionalProperties"] is False
    # said something: kept
    assert closed["properties"]["e"]["additionalProperties"] == {"type": "integer"}
    # a property's name is not a keyword
    assert closed["properties"]["properties"] == {"type": "string"}
    example = {"a": {"b": 1}, "c": [{"d": None}], "e": {"x": 2}, "properties": "p"}
    jsonschema.validate(example, closed)
    jsonschema.validate(example, open_schema)
    assert not jsonschema.Draft202012Validator(closed).is_valid({**example, "extra": 1})


def test_a_template_that_cannot_render_null_content_is_a_400(tiny_model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    tokenizer.chat_template = "{% for m in messages %}{{ '\\n' + m['content'] }}{% endfor %}"
    with pytest.raises(ProtocolError) as info:
        engine_input(tokenizer, messages=HISTORY)
    assert info.value.param == "messages" and "chat template" in info.value.message


def test_auto_without_parallel_calls_keeps_the_first(tokenizer):
    two = (
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": '
        '1}}\n</tool_call>'
    )
    for parallel, names in ((True, ["get_time", "get_weather"]), (False, ["get_time"])):
        request = parse_request(CHAT,
                                {"messages": USER, "tools": TOOLS, "parallel_tool_calls": parallel})
        body = build_response(request, [_output(two)], tokenizer, "tiny",
                              tool_parser=HermesParser())
        assert [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]] == names

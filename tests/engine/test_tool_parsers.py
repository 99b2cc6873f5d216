"""Tool-call parsers for each output format, whole and streamed in fragments of every size."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from baton.services.openai.tool_parsers import (HermesParser, JsonArrayParser, Llama3JsonParser,
                                                NamedFunctionParser, ToolCallStream,
                                                message_with_calls, parser_for_model, scan_object)

WEATHER = '{"city": "Pa\\"ris}", "days": [1, {"x": 2}], "units": "metric"}'
HERMES = (
    f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA = (
    f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}; '
    '{"name": "get_time", "parameters": {}}'
)
ARRAY = (
    f'[{{"name": "get_weather", "arguments": {WEATHER}}}, {{"name":"get_time","arguments":{{}}}}]')
EXPECTED = [("get_weather", json.loads(WEATHER)), ("get_time", {})]
CASES = [(HermesParser(), HERMES, "Let me check.\n"), (Llama3JsonParser(), LLAMA, ""),
         (Llama3JsonParser(), LLAMA.removeprefix("<|python_tag|>"), ""),
         (JsonArrayParser(), ARRAY, "")]


def streamed(parser, text: str, size: int) -> tuple[str, list[tuple[str, str]], list[dict]]:
    """Feeds text in fragments of `size`; returns content, (name, arguments) per call, and the
    deltas."""
    stream, deltas = ToolCallStream(parser), []
    for start in range(0, len(text), size):
        deltas.append(stream.feed(text[start:start + size], start + size >= len(text)))
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for call in d.get("tool_calls", []):
            if "id" in call:
                assert call["id"].startswith(
                    "call_") and call["type"] == "function" and call["index"] not in calls
                calls[call["index"]] = [call["function"]["name"], ""]
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            calls[call["index"]][1] += call["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], deltas


@pytest.mark.parametrize("parser,text,content", CASES)
def test_whole_output(parser, text, content):
    parsed = parser.parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.valid_calls()] == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 5, 17, 1000])
@pytest.mark.parametrize("parser,text,content", CASES)
def test_streamed_fragments_add_up_to_the_whole(parser, text, content, size):
    got_content, calls, _ = streamed(parser, text, size)
    assert got_content == content
    assert [(name, json.loads(args)) for name, args in calls] == EXPECTED


def test_hermes_holds_back_a_partial_tag_and_releases_plain_text():
    assert HermesParser().parse("Hello <tool_", final=False).content == "Hello "
    assert HermesParser().parse("Hello <tool_", final=True).content == "Hello <tool_"
    content, calls, _ = streamed(HermesParser(), "a < b, and <tool> is not a call", 1)
    assert (content, calls) == ("a < b, and <tool> is not a call", [])


def test_llama_plain_text_is_content():
    content, calls, _ = streamed(Llama3JsonParser(), "The weather is fine.", 3)
    assert (content, calls) == ("The weather is fine.", [])
    assert Llama3JsonParser().parse("<|python", final=False).content == ""


def test_unparseable_call_falls_back_to_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    assert message_with_calls(text, HermesParser()) == ({"role": "assistant",
                                                         "content": text}, False)
    assert message_with_calls('{"name": 3, "parameters": {}}', Llama3JsonParser())[1] is False


def test_named_function_streams_its_name_first():
    _, _, deltas = streamed(NamedFunctionParser("get_time"), ' {"tz": "UTC"}', 4)
    first = deltas[0]["tool_calls"][0]
    assert first["function"]["name"] == "get_time" and first["index"] == 0
    message, called = message_with_calls(' {"tz": "UTC"}', NamedFunctionParser("get_time"))
    assert called and message["content"] is None
    assert message["tool_calls"][0]["function"] == {
        "name": "get_time", "arguments": '{"tz": "UTC"}'
    }


def test_message_with_calls_keeps_leading_text():
    message, called = message_with_calls(HERMES, HermesParser())
    assert called and message["content"] == "Let me check.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert len({c["id"] for c in message["tool_calls"]}) == 2


def test_scan_object_reports_open_objects():
    fields, end = scan_object('{"name": "f", "arguments": {"a": [1, "}', 0)
    assert end is None and fields == {"name": '"f"', "arguments": '{"a": [1, "}'}
    fields, end = scan_object('x{"a": 1 , "b": "c"} tail', 1)
    assert fields == {"a": "1", "b": '"c"'} and end == 20


def test_parser_chosen_by_template_and_family(tiny_model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    # its template writes <tool_call>
    assert isinstance(parser_for_model("auto", "llama", tokenizer), HermesParser)
    assert isinstance(parser_for_model("llama3_json", "llama", tokenizer), Llama3JsonParser)
    assert parser_for_model("none", "llama", tokenizer) is None
    tokenizer.chat_template = "{{ '<|python_tag|>' }}"
    assert isinstance(parser_for_model("auto", "llama", tokenizer), Llama3JsonParser)
    tokenizer.chat_template = "{{ messages }}"
    assert isinstance(parser_for_model("auto", "qwen3", tokenizer), HermesParser)
    assert parser_for_model("auto", "mistral", tokenizer) is None

"""The API's ways to ask for structured output, mapped onto the engine's StructuredOutput (no model
runs)."""
from __future__ import annotations

import json

import pytest

from baton.services.common.sampling_params import StructuredOutput
from tests.engine.test_openai_protocol import (CHAT, COMPLETIONS, USER, convert, refusal,
                                               tokenizer)  # noqa: F401

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize("url, extra, expected", [
    (CHAT, {"response_format": {"type": "text"}}, None),
    (CHAT, {"response_format": {"type": "json_object"}}, StructuredOutput("json_object", "")),
    (CHAT, {
        "response_format":
            {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}
    }, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    (COMPLETIONS, {"structured_outputs": {"json": SCHEMA}
                   }, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    (COMPLETIONS, {"structured_outputs": {"json": json.dumps(SCHEMA)}
                   }, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    (COMPLETIONS, {"structured_outputs": {"regex": "a+"}}, StructuredOutput("regex", "a+")),
    (COMPLETIONS, {"structured_outputs": {"choice": ["x", "y"]}
                   }, StructuredOutput("choice", '["x", "y"]')),
    (COMPLETIONS, {"structured_outputs": {"grammar": 'start: "a"'}
                   }, StructuredOutput("grammar", 'start: "a"')),
    (COMPLETIONS, {"structured_outputs": {"json_object": True}}, StructuredOutput(
        "json_object", "")),
    (COMPLETIONS, {"guided_json": SCHEMA}, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    (COMPLETIONS, {"guided_regex": "[0-9]"}, StructuredOutput("regex", "[0-9]")),
    (COMPLETIONS, {"guided_choice": ["p"]}, StructuredOutput("choice", '["p"]')),
    (CHAT, {"guided_grammar": 'start: "b"'}, StructuredOutput("grammar", 'start: "b"')),
    (CHAT, {"response_format": {"type": "text"}, "guided_regex": "z"}, StructuredOutput(
        "regex", "z")),
])
def test_each_way_maps_to_one_structured_output(tokenizer, url, extra, expected):
    base = {"messages": USER} if url == CHAT else {"prompt": "x"}
    assert convert(tokenizer, url,
                   {**base, "max_tokens": 2, **extra}).params.structured_output == expected


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "s"}}}, "response_format"),
    ({
        "response_format":
            {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}
    }, "response_format.json_schema.name"),
    ({
        "response_format":
            {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "nope"}}}
    }, "response_format"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": {"type": "object", "required": 5}}, "guided_json"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
])
def test_bad_structured_requests_name_their_field(tokenizer, extra, param):
    error = refusal(CHAT, {"messages": USER, "max_tokens": 2, **extra}, tokenizer)
    assert error.param == param, error.message

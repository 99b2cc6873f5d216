"""Structured outputs through the whole stack, in both modes, with the official `openai` client.

The model has random weights: left alone it writes gibberish, so output that parses and validates
against a non-trivial schema, every time, can only come from a constrained decoder."""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object", "properties": {
                "city": {"type": "string", "maxLength": 6},
                "zip": {"type": "integer", "minimum": 1000, "maximum": 9999}
            }, "required": ["city", "zip"], "additionalProperties": False
        },
        "tags": {
            "type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1,
            "maxItems": 3
        },
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
MATRIX = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array", "minItems": 2, "maxItems": 3, "items": {
                "type": "array", "minItems": 2, "maxItems": 2,
                "items": {"type": "integer", "minimum": -5, "maximum": 5}
            }
        },
        "ok": {"type": "boolean"},
    },
    "required": ["rows", "ok"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "array",
    "minItems": 2,
    "maxItems": 4,
    "items": {
        "type": "object", "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 50}, "kind": {"enum": ["a", "b"]}
        }, "required": ["id", "kind"], "additionalProperties": False
    },
}
SCHEMAS = {"person": PERSON, "matrix": MATRIX, "items": ITEMS}
MESSAGES = [{"role": "user", "content": "Describe someone as JSON."}]


def _format(name: str) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}
    }


def _valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_sync_streamed_and_not(client, model, name):
    for seed in range(2):
        kwargs = dict(model=model.name, messages=MESSAGES, max_tokens=150, temperature=1.0,
                      seed=seed, response_format=_format(name))
        full = client.chat.completions.create(**kwargs)
        assert full.choices[0].finish_reason == "stop"
        _valid(full.choices[0].message.content, SCHEMAS[name])
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == full.choices[0].message.content


def test_json_schema_async_streamed_and_not(async_client, model):
    async def one(seed: int, stream: bool) -> str:
        kwargs = dict(model=model.name, messages=MESSAGES, max_tokens=150, seed=seed,
                      response_format=_format("person"))
        if not stream:
            return (await async_client.chat.completions.create(**kwargs)).choices[0].message.content
        text = ""
        async for chunk in await async_client.chat.completions.create(**kwargs, stream=True):
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
        return text

    async def run() -> list[str]:
        return await asyncio.gather(*(one(seed, stream) for seed in range(3)
                                      for stream in (False, True)))

    texts = asyncio.run(run())
    for text in texts:
        _valid(text, PERSON)
    assert texts[0::2] == texts[1::2]  # the same seed streamed and not


def test_json_object_greedy(client, model):
    out = client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=100,
                                         temperature=0, response_format={"type": "json_object"})
    text = out.choices[0].message.content
    # Any object is allowed, so a random model may run out of tokens before closing it; it must
    # still be one.
    assert text.startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_regex_choice_and_grammar_on_completions(client, model):
    regex = r"[a-z]{2,5}-[0-9]{3}"
    choices = ["red", "green", "blue sky"]
    for seed in range(3):
        common = dict(model=model.name, prompt="The answer is", max_tokens=30, seed=seed)
        out = client.completions.create(**common,
                                        extra_body={"structured_outputs": {"regex": regex}})
        assert re.fullmatch(regex, out.choices[0].text) and out.choices[0].finish_reason == "stop"
        out = client.completions.create(**common, extra_body={"guided_choice": choices})
        assert out.choices[0].text in choices
        out = client.completions.create(**common, extra_body={"guided_regex": "(yes|no)!"})
        assert out.choices[0].text in ("yes!", "no!")
        out = client.completions.create(**common, extra_body={
            "structured_outputs": {"grammar": 'start: "x=" NUM\nNUM: /[0-9]{1,3}/'}})
        assert re.fullmatch(r"x=[0-9]{1,3}", out.choices[0].text)
        out = client.completions.create(**{**common, "max_tokens": 100},
                                        extra_body={"guided_json": ITEMS})
        _valid(out.choices[0].text, ITEMS)


def test_invalid_schema_is_a_400_naming_the_field(client, model):
    bad = {
        "type": "json_schema", "json_schema": {
            "name": "bad",
            "schema": {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
        }
    }
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=5,
                                       response_format=bad)
    assert e.value.body["param"] == "response_format"
    assert "missing" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=model.name, prompt="x", max_tokens=5,
            extra_body={"structured_outputs": {"grammar": "start: undefined_rule"}})
    assert e.value.body["param"] == "structured_outputs"

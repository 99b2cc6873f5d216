"""The official `openai` client's Responses API against `baton serve` on the embedded model, with
responses stored in SQLite (the stack's gateway) and in PostgreSQL (a gateway beside it).

The model has random weights: arguments and JSON that validate on every call can only come from
the grammar; prompts that render to exactly the tokens of the equivalent chat completion show the
conversation went through the one chat template."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.responses.conftest import MODEL, client

TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]},
                                         "hour": {"type": "integer", "minimum": 0,
                                                  "maximum": 23}},
        "required": ["zone", "hour"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_time", "description": "Time in a zone",
          "parameters": TIME, "strict": True},
         {"type": "function", "name": "get_date", "parameters": {"type": "object",
                                                                 "properties": {}}}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"},
                                           "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def url(request, stack, gateways, pg_url) -> str:
    if request.param == "sqlite":
        return stack.url
    return gateways.get("postgresql", pg_url)


def test_create_retrieve_list_delete(url):
    api = client(url)
    created = api.responses.create(model=MODEL, input="Hello there", max_output_tokens=8,
                                   metadata={"case": "plain"})
    assert created.object == "response" and created.id.startswith("resp_")
    assert created.status in ("completed", "incomplete")
    [message] = created.output
    assert message.type == "message" and message.role == "assistant"
    assert created.output_text == message.content[0].text
    usage = created.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    stored = api.responses.retrieve(created.id)
    assert stored.model_dump() == created.model_dump()
    assert stored.metadata == {"case": "plain"}
    [item] = api.responses.input_items.list(created.id).data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].text == "Hello there"
    api.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(created.id)


def test_previous_response_carries_the_conversation(url):
    api = client(url)
    first = api.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=6,
                                 instructions="Answer briefly.")
    second = api.responses.create(model=MODEL, input="What is my name?", max_output_tokens=6,
                                  previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # instructions are not carried over, as in OpenAI's API; the turns are
    chat = api.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_function_call_items_render_as_tool_messages(url):
    api = client(url)
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time",
            "arguments": json.dumps({"zone": "UTC", "hour": 3})}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "03:00"}
    response = api.responses.create(model=MODEL, max_output_tokens=4, tools=TOOLS, input=[
        {"role": "user", "content": "Time in UTC?"}, call, result])
    chat = api.chat.completions.create(
        model=MODEL, max_tokens=1, tools=[{"type": "function", "function": {
            k: v for k, v in t.items() if k != "type"}} for t in TOOLS],
        messages=[{"role": "user", "content": "Time in UTC?"},
                  {"role": "assistant", "content": None, "tool_calls": [{
                      "id": "call_1", "type": "function",
                      "function": {"name": "get_time", "arguments": call["arguments"]}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "03:00"}])
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    listed = api.responses.input_items.list(response.id, order="asc").data
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]


@pytest.mark.parametrize("seed_input", ["What time is it?", "Tell me the hour in Paris"])
def test_a_required_function_tool_is_called_with_valid_arguments(url, seed_input):
    api = client(url)
    response = api.responses.create(model=MODEL, input=seed_input, tools=TOOLS,
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_output_tokens=200)
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "function_call" and call.status == "completed"
    schema = TIME if call.name == "get_time" else TOOLS[1]["parameters"]
    jsonschema.validate(json.loads(call.arguments), schema)
    named = api.responses.create(model=MODEL, input=seed_input, tools=TOOLS,
                                 tool_choice={"type": "function", "name": "get_time"},
                                 max_output_tokens=200)
    [call] = named.output
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TIME)
    # the call continues into the next turn, its output given back
    follow = api.responses.create(
        model=MODEL, previous_response_id=named.id, max_output_tokens=4, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}])
    assert follow.status in ("completed", "incomplete")


def test_text_format_json_schema(url):
    api = client(url)
    response = api.responses.create(
        model=MODEL, input="Answer in JSON", max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER,
                         "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), ANSWER)
    assert response.text.format.type == "json_schema"


def test_streamed_function_call(url):
    api = client(url)
    with api.responses.stream(model=MODEL, input="What time is it?", tools=TOOLS,
                              tool_choice={"type": "function", "name": "get_time"},
                              max_output_tokens=200) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [call] = final.output
    assert deltas == call.arguments
    jsonschema.validate(json.loads(call.arguments), TIME)
    assert api.responses.retrieve(final.id).output[0].arguments == call.arguments


def test_streamed_text(url):
    api = client(url)
    stream = api.responses.create(model=MODEL, input="Tell me a story", max_output_tokens=12,
                                  stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", events[-1].type]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens <= 12
    assert api.responses.retrieve(final.id).output_text == text


def test_unstored_responses_are_not_kept(url):
    api = client(url)
    response = api.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(response.id)


def test_another_tenants_response_is_not_found(url):
    alpha, beta = client(url, "sk-alpha"), client(url, "sk-beta")
    created = alpha.responses.create(model=MODEL, input="secret", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.input_items.list(created.id)
    with pytest.raises(openai.NotFoundError) as error:
        beta.responses.create(model=MODEL, input="more", previous_response_id=created.id)
    assert error.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        beta.responses.delete(created.id)
    assert alpha.responses.retrieve(created.id).id == created.id

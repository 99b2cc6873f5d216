"""Response bodies of /v1/responses: output items (an assistant `message` with `output_text`, a
`function_call` per tool call), usage, and the response object, as OpenAI's Responses API shapes
them. Items are stored as these same dicts, so a stored conversation renders again through
responses.parse_item."""
from __future__ import annotations

import time
import uuid
from typing import Any

from baton.services.openai.responses import (FunctionCallItem, FunctionCallOutputItem, Item,
                                             MessageItem, ResponsesRequest)
from baton.services.openai.tool_parsers import ToolParser, message_with_calls

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed",
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """logprobs: chat-style entries of the text's tokens (include message.output_text.logprobs)."""
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs or []}] if status == "completed" else []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def output_items(text: str, parser: ToolParser | None,
                 logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A finished output's items: its text as a message, its tool calls (read by `parser`) as
    function_call items. The text's token logprobs go with the message only when it is the whole
    output: once calls are parsed out of it, its tokens no longer line up with its text."""
    message, called = message_with_calls(text, parser)
    items = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"],
                                  logprobs=None if called else logprobs))
    for call in message.get("tool_calls", []) if called else []:
        function = call["function"]
        items.append(function_call_item(new_id("fc"), call["id"], function["name"],
                                        function["arguments"]))
    return items or [message_item(new_id("msg"), text, logprobs=logprobs)]


def stored_items(items: list[Item]) -> list[dict[str, Any]]:
    """Input items as stored and listed (/input_items): each with an id, text as parts."""
    stored = []
    for item in items:
        body = item.model_dump(exclude_none=True)
        if isinstance(item, MessageItem):
            kind = "output_text" if item.role == "assistant" else "input_text"
            body["content"] = [{"type": kind, "text": item.text()}]
            body.setdefault("status", "completed")
        elif isinstance(item, FunctionCallOutputItem):
            body["output"] = item.text()
        prefix = {MessageItem: "msg", FunctionCallItem: "fc"}.get(type(item), "fco")
        body.setdefault("id", new_id(prefix))
        stored.append(body)
    return stored


def usage_of(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """A finished output's status and incomplete_details."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return ("completed", None) if finish_reason else ("failed", None)


def response_body(request: ResponsesRequest, response_id: str, model: str, status: str,
                  output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                  incomplete: dict[str, Any] | None = None,
                  error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The response object, with the request's settings echoed as OpenAI's are."""
    choice = request.tool_choice
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": status, "background": request.background, "error": error,
        "incomplete_details": incomplete, "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens, "model": model, "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
        "store": request.store, "temperature": request.temperature,
        "text": {"format": request.text.format.model_dump(by_alias=True, exclude_none=True)},
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [t.model_dump() for t in request.tools], "top_p": request.top_p,
        "truncation": "disabled", "usage": usage, "user": request.user,
        "metadata": request.metadata,
    }

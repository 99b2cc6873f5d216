"""A streamed /v1/responses body: OpenAI's semantic events, each with its `sequence_number`.

response.created, response.in_progress; per output item response.output_item.added, then for a
message response.content_part.added, response.output_text.delta..., response.output_text.done,
response.content_part.done, or for a function call response.function_call_arguments.delta...,
.done; response.output_item.done; and last (written by the gateway once the response is stored)
response.completed, response.incomplete or response.failed with the whole response.

The text becomes items as chat's streamed tool calls do (tool_parsers.ToolCallStream), so a forced
call streams its grammar-held arguments as they are generated."""
from __future__ import annotations

import json
from typing import Any

from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.render import Choice, TokenText, chat_logprob
from baton.services.openai.responses_output import function_call_item, message_item, new_id
from baton.services.openai.streaming import Delta
from baton.services.openai.tool_parsers import ToolCallStream, ToolParser


class ResponsesEventWriter:
    """The events of one streamed response (an EventWriter for the gateway's serving)."""

    def __init__(self, request: ChatCompletionRequest, response: dict[str, Any],
                 tool_parser: ToolParser | None, text_of: TokenText | None = None) -> None:
        """text_of: how tokens are named in logprobs, None when they were not asked for."""
        self.response = response  # the response object as it stands (status in_progress)
        parser = request.tool_parser(tool_parser)
        self.calls = ToolCallStream(parser) if parser is not None else None
        # a message's tokens line up with its text only when no tool calls are parsed out of it
        self.text_of = text_of if self.calls is None else None
        self.held_logprobs: list[dict[str, Any]] = []
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items in order, completed as they end
        self.message: dict[str, Any] | None = None  # the message item being written
        self.by_call: dict[int, dict[str, Any]] = {}  # a call's index -> its item

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def opening(self, states: list[Choice]) -> list[str]:
        return [self.event("response.created", response=self.response),
                self.event("response.in_progress", response=self.response)]

    def delta(self, state: Choice, new: Delta) -> str:
        if self.calls is None:
            delta: dict[str, Any] = {"content": new.text} if new.text else {}
        else:
            delta = self.calls.feed(new.text, new.finished)
        if self.text_of is not None:
            # a token whose text is held back (part of a character) goes with the next text
            self.held_logprobs += [chat_logprob(lp, self.text_of) for lp in new.logprobs]
        events = [self._text(delta["content"])] if delta.get("content") else []
        events += [self._call(call) for call in delta.get("tool_calls", [])]
        if new.finished:
            if not self.items:  # nothing generated: an empty message, as the body has
                events.append(self._text(""))
            if self.message is not None:
                self.message["logprobs"] += self.held_logprobs
            events += [self._done(item) for item in self.items]
        return "".join(events)

    def _text(self, text: str) -> str:
        events = ""
        if self.message is None:
            self.message = message_item(new_id("msg"), "", "in_progress")
            self.message["text"], self.message["logprobs"] = "", []
            self.items.append(self.message)
            events += self.event("response.output_item.added", output_index=self._index(
                self.message), item=message_item(self.message["id"], "", "in_progress"))
            events += self.event("response.content_part.added", item_id=self.message["id"],
                                 output_index=self._index(self.message), content_index=0,
                                 part=_part(""))
        self.message["text"] += text
        if not text:
            return events
        logprobs, self.held_logprobs = self.held_logprobs, []
        self.message["logprobs"] += logprobs
        return events + self.event("response.output_text.delta", item_id=self.message["id"],
                                   output_index=self._index(self.message), content_index=0,
                                   delta=text, logprobs=logprobs)

    def _call(self, call: dict[str, Any]) -> str:
        function = call.get("function", {})
        item = self.by_call.get(call["index"])
        events = ""
        if item is None:
            item = function_call_item(new_id("fc"), call["id"], function["name"], "",
                                      "in_progress")
            self.by_call[call["index"]] = item
            self.items.append(item)
            events += self.event("response.output_item.added", output_index=self._index(item),
                                 item=dict(item))
        fragment = function.get("arguments") or ""
        item["arguments"] += fragment
        if fragment:
            events += self.event("response.function_call_arguments.delta", item_id=item["id"],
                                 output_index=self._index(item), delta=fragment)
        return events

    def _done(self, item: dict[str, Any]) -> str:
        index = self._index(item)
        if item["type"] == "message":
            text, logprobs = item.pop("text"), item.pop("logprobs")
            item.update(message_item(item["id"], text, logprobs=logprobs))
            return (self.event("response.output_text.done", item_id=item["id"],
                               output_index=index, content_index=0, text=text,
                               logprobs=logprobs) +
                    self.event("response.content_part.done", item_id=item["id"],
                               output_index=index, content_index=0,
                               part=item["content"][0]) +
                    self.event("response.output_item.done", output_index=index, item=item))
        item["status"] = "completed"
        return (self.event("response.function_call_arguments.done", item_id=item["id"],
                           output_index=index, name=item["name"], arguments=item["arguments"]) +
                self.event("response.output_item.done", output_index=index, item=item))

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, known in enumerate(self.items) if known is item)

    def closing(self, states: list[Choice]) -> list[str]:
        """Nothing: the last event carries the stored response (see the gateway's route)."""
        return []

    def output(self) -> list[dict[str, Any]]:
        """The output items as they ended (those cut short keep status in_progress)."""
        return [{k: v for k, v in item.items() if k not in ("text", "logprobs")}
                for item in self.items]


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

"""Tool calls read back from a model's text, one parser per output format behind one interface, and
the OpenAI deltas a growing text streams as.

Formats: Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; Llama 3.x JSON
`{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`, several separated by `;`);
and the two outputs a forced tool_choice is constrained to (a named function's bare arguments,
`required`'s JSON array).

Every parser works on partial text as well: arguments are the raw JSON text written so far, so each
snapshot extends the previous one and streaming sends only the new suffix.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase


@dataclass
class PartialCall:
    name: str | None  # None until the name's string is complete
    arguments: str  # the raw JSON text of the arguments so far

    def valid(self) -> bool:
        if self.name is None:
            return False
        try:
            return isinstance(json.loads(self.arguments), dict)
        except json.JSONDecodeError:
            return False


@dataclass
class Parsed:
    content: str  # text that is not a tool call; on partial text, only what cannot still become one
    calls: list[PartialCall] = field(default_factory=list)

    def valid_calls(self) -> list[PartialCall]:
        return [c for c in self.calls if c.valid()]


class ToolParser(Protocol):
    def parse(self, text: str, final: bool) -> Parsed:
        """Content and calls of `text`; `final` once the output is complete. A final parse that
        finds no valid call returns the whole text as content."""


def scan_object(text: str, start: int) -> tuple[dict[str, str], int | None]:
    """Top-level fields of the JSON object opening at text[start] ("{"), possibly unfinished: key ->
    raw value text so far; and the index after the object's end (None while it is open)."""
    fields: dict[str, str] = {}
    depth, in_string, escaped = 0, False, False
    key_start, key, value_start = start, None, None

    def close_field(end: int) -> None:
        if key is not None and value_start is not None:
            fields[key] = text[value_start:end].rstrip()

    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
            continue
        if depth == 1 and key is not None and value_start is None and not c.isspace():
            value_start = i
        if c == '"' and depth == 1 and key is None:
            key_start = i
        if c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                close_field(i)
                return fields, i + 1
        elif c == "," and depth == 1:
            close_field(i)
            key, value_start = None, None
        elif c == ":" and depth == 1 and key is None:
            try:
                key = json.loads(text[key_start:i])
            except json.JSONDecodeError:
                key = ""
    close_field(len(text))
    return fields, None


def _call(fields: dict[str, str], argument_keys: tuple[str, ...]) -> PartialCall:
    name = None
    try:
        loaded = json.loads(fields.get("name", ""))
        name = loaded if isinstance(loaded, str) else None
    except json.JSONDecodeError:
        pass
    arguments = next((fields[k] for k in argument_keys if k in fields), "")
    return PartialCall(name, arguments)


def _held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of text that could be the start of marker."""
    return next(
        (n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])),
        0)


def _finish(parsed: Parsed, text: str, final: bool) -> Parsed:
    if final and not parsed.valid_calls():
        return Parsed(text, [])
    return parsed


class HermesParser:
    """Qwen 2.5/3, Hermes: content, then `<tool_call>{...}</tool_call>` blocks; text after the first
    call is dropped, as vLLM's parser does."""
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> Parsed:
        first = text.find(self.OPEN)
        if first < 0:
            held = 0 if final else _held_back(text, self.OPEN)
            return Parsed(text[:len(text) - held])
        parsed = Parsed(text[:first])
        pos = first
        while pos >= 0:
            body = pos + len(self.OPEN)
            end = text.find(self.CLOSE, body)
            segment = text[body:] if end < 0 else text[body:end]
            brace = segment.find("{")
            if brace >= 0 and not segment[:brace].strip():
                parsed.calls.append(
                    _call(scan_object(segment, brace)[0], ("arguments", "parameters")))
            pos = -1 if end < 0 else text.find(self.OPEN, end)
        return _finish(parsed, text, final)


class Llama3JsonParser:
    """Llama 3.1-3.3: the whole output is the call(s), `{"name": ..., "parameters": {...}}`,
    possibly after `<|python_tag|>` and separated by `;`. An output that does not start with `{` is
    content."""
    TAG = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> Parsed:
        body = text.lstrip()
        tagged = body.startswith(self.TAG)
        body = body[len(self.TAG):].lstrip() if tagged else body
        if not final and (not body if tagged else self.TAG.startswith(body)):
            return Parsed("")  # nothing yet, or maybe the tag's start: wait
        if not body.startswith("{"):
            return Parsed(text)
        parsed, pos = Parsed(""), 0
        while pos is not None and pos < len(body) and body[pos] == "{":
            fields, pos = scan_object(body, pos)
            parsed.calls.append(_call(fields, ("parameters", "arguments")))
            if pos is not None:
                rest = body[pos:].lstrip().removeprefix(";").lstrip()
                pos = len(body) - len(rest)
        return _finish(parsed, text, final)


class JsonArrayParser:
    """`tool_choice: required`: the output is constrained to `[{"name": ..., "arguments": {...}},
    ...]`."""

    def parse(self, text: str, final: bool) -> Parsed:
        parsed, pos = Parsed(""), text.find("[") + 1
        while pos:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
                pos += 1
            if pos >= len(text) or text[pos] != "{":
                break
            fields, end = scan_object(text, pos)
            parsed.calls.append(_call(fields, ("arguments",)))
            pos = end or 0
        return _finish(parsed, text, final)


class NamedFunctionParser:
    """A named tool_choice: the output is constrained to the function's arguments object."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, final: bool) -> Parsed:
        return _finish(Parsed("", [PartialCall(self.name, text.strip())]), text, final)


class FirstCallOnly:
    """parallel_tool_calls false with an auto choice: a model that writes several calls gets its
    first."""

    def __init__(self, inner: ToolParser) -> None:
        self.inner = inner

    def parse(self, text: str, final: bool) -> Parsed:
        parsed = self.inner.parse(text, final)
        return Parsed(parsed.content, parsed.calls[:1])


PARSERS: dict[str, type] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def parser_for_model(setting: str, model_type: str,
                     tokenizer: PreTrainedTokenizerBase) -> ToolParser | None:
    """The parser for `auto` tool choice: `setting` names one ("hermes", "llama3_json"), or is
    "auto" (from the chat template's call format, else the model family) or "none" (auto choices are
    never parsed as calls)."""
    if setting in PARSERS:
        return PARSERS[setting]()
    if setting != "auto":
        return None
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if "<tool_call>" in template:
        return HermesParser()
    if "<|python_tag|>" in template or '"parameters": ' in template:
        return Llama3JsonParser()
    if model_type.startswith("qwen"):
        return HermesParser()
    if model_type == "llama" and "<|eot_id|>" in template:
        return Llama3JsonParser()
    return None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def message_with_calls(text: str, parser: ToolParser | None,
                       truncated: bool = False) -> tuple[dict[str, Any], bool]:
    """The assistant message of a finished output, and whether it called tools (content is then null
    unless the model wrote text before its calls). A `truncated` output (max_tokens) keeps the calls
    begun, their arguments cut where the output was, as its stream carried them."""
    if parser is None:
        return {"role": "assistant", "content": text}, False
    parsed = parser.parse(text, final=not truncated)
    calls = [c for c in parsed.calls if c.name is not None] if truncated else parsed.valid_calls()
    if not calls:
        return {"role": "assistant", "content": text}, False
    tool_calls = [{
        "id": new_call_id(), "type": "function",
        "function": {"name": c.name, "arguments": c.arguments}
    } for c in calls]
    return {"role": "assistant", "content": parsed.content if parsed.content.strip() else None,
            "tool_calls": tool_calls}, True


class ToolCallStream:
    """One choice's growing text as OpenAI chat deltas: content, then per call one delta with its
    id, type and name, then fragments of its arguments."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.content_sent = 0
        self.arguments_sent: list[str] = []  # per call announced so far

    @property
    def called(self) -> bool:
        return bool(self.arguments_sent)

    def feed(self, text: str, final: bool, truncated: bool = False) -> dict[str, Any]:
        """The delta for `text` (appended to what came before): {"content": ...} and/or
        {"tool_calls": [...]}. A final text `truncated` by max_tokens keeps the calls begun, as
        message_with_calls reads it."""
        self.text += text
        parsed = self.parser.parse(self.text, final and not truncated)
        if final and truncated and not any(c.name is not None for c in parsed.calls):
            parsed = self.parser.parse(self.text, True)
        delta: dict[str, Any] = {}
        if len(parsed.content) > self.content_sent:
            delta["content"] = parsed.content[self.content_sent:]
            self.content_sent = len(parsed.content)
        calls = [
            d for i, call in enumerate(parsed.calls) if (d := self._call_delta(i, call)) is not None
        ]
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _call_delta(self, index: int, call: PartialCall) -> dict[str, Any] | None:
        if call.name is None or index > len(self.arguments_sent):
            return None
        if index == len(self.arguments_sent):
            self.arguments_sent.append(call.arguments)
            return {"index": index, "id": new_call_id(), "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}
        sent = self.arguments_sent[index]
        if len(call.arguments) <= len(sent) or not call.arguments.startswith(sent):
            return None
        self.arguments_sent[index] = call.arguments
        return {"index": index, "function": {"arguments": call.arguments[len(sent):]}}

"""Streamed responses as server-sent events, one chunk writer per endpoint, in vLLM's shapes: what
opens a stream, the chunk for each message a choice receives, and how the stream closes (usage when
asked, then the endpoint's terminator). The gateway picks the writer with the endpoint's route and
knows none of these formats.
"""
from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from baton.services.common.outputs import TokenLogprobs
from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.completions import CompletionRequest
from baton.services.openai.endpoints import OpenAIRequest
from baton.services.openai.render import (Choice, TokenText, chat_logprob, completion_logprobs,
                                          echo_logprobs, prompt_text, prompt_tokens,
                                          usage_body)
from baton.services.openai.tool_parsers import ToolCallStream, ToolParser


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


@dataclass
class Delta:
    """What one message adds to a choice while it streams."""
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs]
    finished: bool


class EventWriter(Protocol):
    """What the gateway streams a response's events through: an endpoint's chunk writer, or the
    Responses API's event writer (responses_stream)."""

    def opening(self, states: list[Choice]) -> list[str]: ...

    def delta(self, state: Choice, new: Delta) -> str: ...

    def closing(self, states: list[Choice]) -> list[str]: ...


class ChunkWriter(ABC):
    """One streamed response's chunks; a subclass per endpoint shapes its choices."""
    OBJECT: ClassVar[str]

    def __init__(self, request: OpenAIRequest, response_id: str, model: str,
                 text_of: TokenText) -> None:
        self.request = request
        self.base = {"id": response_id, "object": self.OBJECT, "created": int(time.time()),
                     "model": model}
        self.text_of = text_of

    def _chunk(self, choice: dict[str, Any], state: Choice | None = None) -> str:
        """A chunk of one choice; with continuous_usage_stats, the usage of `state` so far (vLLM
        counts each choice's own tokens)."""
        chunk = {**self.base, "choices": [choice]}
        options = self.request.stream_options
        if state is not None and options is not None and options.include_usage and \
                options.continuous_usage_stats:
            generated = 0 if self.request.scores_only else len(state.token_ids)
            chunk["usage"] = usage_body(len(state.prompt_token_ids), generated,
                                        state.num_cached_tokens)
        return sse(chunk)

    def opening(self, states: list[Choice]) -> list[str]:
        """The chunks sent before any choice's first message."""
        return []

    def delta(self, state: Choice, new: Delta) -> str:
        """The chunk for what `new` added to `state` (already folded in)."""
        want = self.request.logprobs_k()[1] is not None
        finish = {"finish_reason": state.finish_reason if new.finished else None}
        if new.finished:
            finish["stop_reason"] = state.stop_reason
            if self.request.scores_only:
                finish = {"finish_reason": "length", "stop_reason": None}
        choice = {"index": state.index, **self._fields(state, new, want, finish)}
        if self.request.return_token_ids:
            choice["token_ids"] = list(new.token_ids)
        return self._chunk(choice, state)

    @abstractmethod
    def _fields(self, state: Choice, new: Delta, want: bool,
                finish: dict[str, Any]) -> dict[str, Any]:
        """A chunk's choice after its index: the endpoint's own fields, then `finish`'s."""

    def closing(self, states: list[Choice]) -> list[str]:
        """The chunks after every choice ended: the usage when the request asks for it, then the
        terminator."""
        options = self.request.stream_options
        usage = [self.usage(states)] if options is not None and options.include_usage else []
        return usage + [self.end()]

    def usage(self, states: list[Choice]) -> str:
        generated = 0 if self.request.scores_only else sum(len(s.token_ids) for s in states)
        usage = usage_body(prompt_tokens(self.request, states), generated,
                           max(s.num_cached_tokens for s in states))
        return sse({**self.base, "choices": [], "usage": usage})

    def end(self) -> str:
        """Completions and chat streams end with OpenAI's `[DONE]`; an endpoint whose stream ends
        otherwise overrides this."""
        return sse("[DONE]")


class CompletionChunkWriter(ChunkWriter):
    """/v1/completions chunks: text with completions-style logprobs; with echo, a choice's first
    chunk starts with the prompt."""
    OBJECT = "text_completion"
    request: CompletionRequest

    def __init__(self, request: CompletionRequest, response_id: str, model: str,
                 text_of: TokenText) -> None:
        super().__init__(request, response_id, model, text_of)
        self.offsets: dict[int, int] = {}  # logprobs: text offset per choice

    def _fields(self, state: Choice, new: Delta, want: bool,
                finish: dict[str, Any]) -> dict[str, Any]:
        text, logprobs = new.text, new.logprobs
        # max_tokens 0: the one token run to score the prompt is not shown
        if self.request.scores_only:
            text, logprobs = "", []
        first = self.request.echo and state.index not in self.offsets
        if first:
            text = prompt_text(self.request, state.index, self.text_of) + text
        lp = None
        if want and first:
            lp = echo_logprobs(state.prompt_token_ids, state.prompt_logprobs or [None], logprobs,
                               self.text_of)
        elif want:
            lp = completion_logprobs(logprobs, self.text_of, self.offsets.get(state.index, 0))
        if lp is not None or first:
            tokens = lp["tokens"] if lp is not None else []
            offset = self.offsets.get(state.index, 0)
            self.offsets[state.index] = offset + sum(len(t) for t in tokens)
        return {"text": text, "logprobs": lp, **finish}


class ChatChunkWriter(ChunkWriter):
    """/v1/chat/completions chunks: each choice opens with the assistant role, then content deltas,
    or tool-call deltas when the text is a tool call."""
    OBJECT = "chat.completion.chunk"
    request: ChatCompletionRequest

    def __init__(self, request: ChatCompletionRequest, response_id: str, model: str,
                 text_of: TokenText, tool_parser: ToolParser | None = None) -> None:
        super().__init__(request, response_id, model, text_of)
        # How the text becomes tool-call deltas (None: it streams as content); one stream per
        # choice. `tool_parser` is the model family's format, for an auto tool_choice.
        self.tool_parser = request.tool_parser(tool_parser)
        self.tool_streams: dict[int, ToolCallStream] = {}

    def opening(self, states: list[Choice]) -> list[str]:
        """Each choice opens with the assistant role, as OpenAI's streams do; with echo, the
        content it continues (vLLM's echo)."""
        echoed = self.request.echo_text()
        return [self._chunk({"index": s.index, "delta": {"role": "assistant", "content": echoed},
                             "logprobs": None, "finish_reason": None}, s) for s in states]

    def _fields(self, state: Choice, new: Delta, want: bool,
                finish: dict[str, Any]) -> dict[str, Any]:
        delta, called = self._delta(state.index, new, state.finish_reason == "length")
        if called and finish["finish_reason"] == "stop":
            finish["finish_reason"] = "tool_calls"
        lp = None
        if want:
            lp = {"content": [chat_logprob(x, self.text_of) for x in new.logprobs]}
        return {"delta": delta, "logprobs": lp, **finish}

    def _delta(self, index: int, new: Delta, truncated: bool) -> tuple[dict[str, Any], bool]:
        """A chunk's delta, and whether the choice has called a tool so far."""
        if self.tool_parser is None:
            return ({"content": new.text} if new.text else {}), False
        stream = self.tool_streams.setdefault(index, ToolCallStream(self.tool_parser))
        return stream.feed(new.text, new.finished, truncated), stream.called

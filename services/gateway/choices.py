"""A choice's state as its messages arrive, and the OpenAI bodies made from it: streamed chunks (SSE) and the
final response. Text comes detokenized from the workers (stop strings resolved there)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from baton.services.common.convert import (logprob_from_proto, prompt_logprobs_from_proto,
                                           stop_reason_of)
from baton.services.common.openai_protocol import (ChatCompletionRequest, CompletionRequest, OpenAIRequest,
                                                   TokenText, chat_logprob, completion_logprobs, echo_logprobs,
                                                   usage_body)
from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.tool_parsers import ToolCallStream, ToolParser
from baton.v1 import worker_pb2 as pb


@dataclass
class ChoiceState:
    index: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # from the first message that carries them

    def add(self, message: pb.GenerateResponse) -> list[TokenLogprobs]:
        """Folds a message in; returns its logprobs (for the streamed chunk)."""
        self.token_ids += message.token_ids
        self.text += message.text
        new = [logprob_from_proto(lp) for lp in message.logprobs]
        self.logprobs += new
        self.num_cached_tokens = max(self.num_cached_tokens, message.num_cached_tokens)
        if message.prompt_logprobs and self.prompt_logprobs is None:
            self.prompt_logprobs = prompt_logprobs_from_proto(message.prompt_logprobs)
        if message.finished:
            self.finish_reason = message.finish_reason or None
            self.stop_reason = stop_reason_of(message)
        return new

    def as_output(self, want_logprobs: bool, want_prompt_logprobs: bool = False) -> RequestOutput:
        # A one-token prompt has nothing to score: its (empty) entries never travel.
        prompt_logprobs = (self.prompt_logprobs or [None]) if want_prompt_logprobs else None
        return RequestOutput(request_id="", prompt_token_ids=self.prompt_token_ids, token_ids=self.token_ids,
                             text=self.text, num_new_tokens=0, new_text="", finished=True,
                             finish_reason=self.finish_reason, stop_reason=self.stop_reason,
                             logprobs=self.logprobs if want_logprobs else None,
                             num_cached_tokens=self.num_cached_tokens, prompt_logprobs=prompt_logprobs)


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class ChunkWriter:
    """Streamed chunks in vLLM's shapes for completions and chat completions."""

    def __init__(self, request: OpenAIRequest, response_id: str, model: str, text_of: TokenText,
                 tool_parser: ToolParser | None = None) -> None:
        self.request = request
        self.chat = isinstance(request, ChatCompletionRequest)
        # How chat text becomes tool-call deltas (None: it streams as content); one stream per choice.
        self.tool_parser = request.tool_parser(tool_parser) if isinstance(request, ChatCompletionRequest) else None
        self.tool_streams: dict[int, ToolCallStream] = {}
        self.base = {"id": response_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(time.time()), "model": model}
        self.text_of = text_of
        self.offsets: dict[int, int] = {}  # completions logprobs: text offset per choice
        self.echo = isinstance(request, CompletionRequest) and request.echo

    def _chunk(self, choice: dict[str, Any]) -> str:
        return sse({**self.base, "choices": [choice]})

    def role(self, index: int) -> str:
        """Chat streams open each choice with the assistant role, as OpenAI's do."""
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def delta(self, state: ChoiceState, message: pb.GenerateResponse, logprobs: list[TokenLogprobs]) -> str:
        want = self.request.logprobs_k()[1] is not None
        finish = {"finish_reason": state.finish_reason if message.finished else None}
        if message.finished:
            finish["stop_reason"] = state.stop_reason
            if self.request.scores_only:
                finish = {"finish_reason": "length", "stop_reason": None}
        if self.chat:
            delta, called = self._chat_delta(state.index, message)
            if called and finish["finish_reason"] == "stop":
                finish["finish_reason"] = "tool_calls"
            lp = {"content": [chat_logprob(x, self.text_of) for x in logprobs]} if want else None
            choice = {"index": state.index, "delta": delta, "logprobs": lp, **finish}
        else:
            choice = {"index": state.index, **self._completion_delta(state, message, logprobs, want), **finish}
        if self.request.return_token_ids:
            choice["token_ids"] = list(message.token_ids)
        return self._chunk(choice)

    def _chat_delta(self, index: int, message: pb.GenerateResponse) -> tuple[dict[str, Any], bool]:
        """A chat chunk's delta, and whether the choice has called a tool so far."""
        if self.tool_parser is None:
            return ({"content": message.text} if message.text else {}), False
        stream = self.tool_streams.setdefault(index, ToolCallStream(self.tool_parser))
        return stream.feed(message.text, message.finished), stream.called

    def _completion_delta(self, state: ChoiceState, message: pb.GenerateResponse, logprobs: list[TokenLogprobs],
                          want: bool) -> dict[str, Any]:
        """A completions chunk's text and logprobs; with echo, a choice's first chunk starts with the prompt."""
        text = message.text
        if self.request.scores_only:  # max_tokens 0: the one token run to score the prompt is not shown
            text, logprobs = "", []
        first = self.echo and state.index not in self.offsets
        if first:
            prompt = self.request.prompt
            text = (prompt if isinstance(prompt, str) else self.text_of.tokenizer.decode(prompt)) + text
        lp = None
        if want and first:
            lp = echo_logprobs(state.prompt_token_ids, state.prompt_logprobs or [None], logprobs, self.text_of)
        elif want:
            lp = completion_logprobs(logprobs, self.text_of, self.offsets.get(state.index, 0))
        if lp is not None or first:
            tokens = lp["tokens"] if lp is not None else []
            self.offsets[state.index] = self.offsets.get(state.index, 0) + sum(len(t) for t in tokens)
        return {"text": text, "logprobs": lp}

    def usage(self, states: list[ChoiceState]) -> str:
        generated = 0 if self.request.scores_only else sum(len(s.token_ids) for s in states)
        usage = usage_body(len(states[0].prompt_token_ids), generated, max(s.num_cached_tokens for s in states))
        return sse({**self.base, "choices": [], "usage": usage})

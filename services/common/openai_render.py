"""OpenAI response bodies for /v1/completions and /v1/chat/completions, in vLLM's shapes: the
final body (`build_response`) and the streamed chunks (`ChunkWriter`), both made from plain `Choice`
states.

The gateway fills a Choice from worker messages as they arrive; `baton run-batch` fills one from a
finished engine output (`Choice.of`). Request parsing and validation live in openai_protocol.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from baton.services.common.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   OpenAIRequest, new_response_id)
from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.prompt_scoring import vllm_prompt_logprobs
from baton.services.common.tool_parsers import ToolCallStream, ToolParser, message_with_calls

# OpenAI's JSON stand-in for -inf.
MIN_LOGPROB = -9999.0


@dataclass
class Choice:
    """One of a request's n choices: what has been generated so far (all of it, once finished)."""
    index: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] | None = None  # None: not asked for
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # One per prompt token (the first has none).
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    @classmethod
    def of(cls, out: RequestOutput, index: int = 0) -> Choice:
        """A finished engine output's choice."""
        return cls(index, out.prompt_token_ids, out.token_ids, out.text, out.logprobs,
                   out.finish_reason, out.stop_reason, out.num_cached_tokens, out.prompt_logprobs)


class TokenText:
    """Text of single tokens, as vLLM shows them in logprobs (memoized: top-k repeats ids a lot)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self.cache[token_id]


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
def completion_logprobs(logprobs: list[TokenLogprobs], text_of: TokenText,
                        offset: int = 0) -> dict[str, list]:
    """Completions-style logprobs; `offset` is where the first token's text starts (streamed chunks
    continue)."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs:
        token = text_of(lp.token_id)
        tokens.append(token)
        values.append(_clamp(lp.logprob))
        offsets.append(offset)
        offset += len(token)
        # OpenAI's completions list the top k plus the chosen token when it is not among them.
        # Tokens that render alike (byte fragments) share a key; the best-ranked keeps it.
        top: dict[str, float] = {}
        for t, v in lp.top.items():
            top.setdefault(text_of(t), _clamp(v))
        top.setdefault(token, _clamp(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def echo_logprobs(prompt: list[int], prompt_logprobs: list[TokenLogprobs | None],
                  generated: list[TokenLogprobs], text_of: TokenText) -> dict[str, list]:
    """Completions logprobs with echo: the prompt's tokens first, the first one unscored (null), as
    OpenAI's."""
    first = text_of(prompt[0])
    scored = [lp for lp in prompt_logprobs[1:] if lp is not None]
    rest = completion_logprobs(scored + generated, text_of, offset=len(first))
    return {"tokens": [first] + rest["tokens"], "token_logprobs": [None] + rest["token_logprobs"],
            "top_logprobs": [None] + rest["top_logprobs"], "text_offset": [0] + rest["text_offset"]}


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": _clamp(logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprob(lp: TokenLogprobs, text_of: TokenText) -> dict[str, Any]:
    entry = _chat_entry(text_of(lp.token_id), lp.logprob)
    entry["top_logprobs"] = [_chat_entry(text_of(t), v) for t, v in lp.top.items()]
    return entry


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens is the prompt's share served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _prompt_text(request: CompletionRequest, text_of: TokenText) -> str:
    prompt = request.prompt
    return prompt if isinstance(prompt, str) else text_of.tokenizer.decode(prompt)


def completion_choice(request: CompletionRequest, c: Choice, index: int,
                      text_of: TokenText) -> dict[str, Any]:
    """A completions response's choice."""
    logprobs = None if c.logprobs is None else completion_logprobs(c.logprobs, text_of)
    text = c.text
    if request.echo:
        text = _prompt_text(request, text_of) + text
        if c.logprobs is not None:
            prompt_logprobs = c.prompt_logprobs or [None]
            logprobs = echo_logprobs(c.prompt_token_ids, prompt_logprobs, c.logprobs, text_of)
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason,
              "stop_reason": c.stop_reason}
    if request.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(c.prompt_logprobs or [None], text_of,
                                                         _clamp)
    if request.return_token_ids:
        choice.update(prompt_token_ids=c.prompt_token_ids, token_ids=c.token_ids)
    return choice


def chat_choice(request: ChatCompletionRequest, c: Choice, index: int, text_of: TokenText,
                tool_parser: ToolParser | None) -> dict[str, Any]:
    """A chat response's choice; `tool_parser` (None: plain content) turns the text into tool
    calls."""
    logprobs = None
    if c.logprobs is not None:
        logprobs = {"content": [chat_logprob(lp, text_of) for lp in c.logprobs]}
    message, called = message_with_calls(c.text, tool_parser)
    finish_reason = "tool_calls" if called and c.finish_reason == "stop" else c.finish_reason
    choice = {"index": index, "message": message, "logprobs": logprobs,
              "finish_reason": finish_reason, "stop_reason": c.stop_reason}
    if request.return_token_ids:
        choice["token_ids"] = c.token_ids
    return choice


def _prompt_only(c: Choice) -> Choice:
    """max_tokens 0 with echo: the engine ran one token so the prompt was scored; the answer is the
    prompt alone."""
    return replace(c, token_ids=[], text="", finish_reason="length", stop_reason=None,
                   logprobs=[] if c.logprobs is not None else None)


def build_response(request: OpenAIRequest, choices: list[Choice],
                   tokenizer: PreTrainedTokenizerBase, model: str, response_id: str | None = None,
                   tool_parser: ToolParser | None = None) -> dict[str, Any]:
    """The response body for a finished request; choices are its n in order. `tool_parser` reads
    tool calls in the model family's format, for chat requests whose tool_choice is auto."""
    chat = isinstance(request, ChatCompletionRequest)
    text_of = TokenText(tokenizer)
    if request.scores_only:
        choices = [_prompt_only(c) for c in choices]
    if isinstance(request, ChatCompletionRequest):
        parser = request.tool_parser(tool_parser)
        bodies = [chat_choice(request, c, i, text_of, parser) for i, c in enumerate(choices)]
    else:
        bodies = [completion_choice(request, c, i, text_of) for i, c in enumerate(choices)]
    prompt_tokens = len(choices[0].prompt_token_ids)
    completion_tokens = sum(len(c.token_ids) for c in choices)
    body: dict[str, Any] = {
        "id": response_id or new_response_id(request),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": bodies,
        "usage": usage_body(prompt_tokens, completion_tokens,
                            max(c.num_cached_tokens for c in choices)),
    }
    if chat and request.return_token_ids:
        body["prompt_token_ids"] = choices[0].prompt_token_ids
    if chat and request.prompt_logprobs is not None:  # vLLM puts chat's at the top level
        body["prompt_logprobs"] = vllm_prompt_logprobs(choices[0].prompt_logprobs or [None],
                                                       text_of, _clamp)
    return body


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


@dataclass
class Delta:
    """What one message adds to a choice while it streams."""
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs]
    finished: bool


class ChunkWriter:
    """Streamed chunks in vLLM's shapes for completions and chat completions."""

    def __init__(self, request: OpenAIRequest, response_id: str, model: str, text_of: TokenText,
                 tool_parser: ToolParser | None = None) -> None:
        self.request = request
        self.chat = isinstance(request, ChatCompletionRequest)
        # How chat text becomes tool-call deltas (None: it streams as content); one stream per
        # choice.
        self.tool_parser = (request.tool_parser(tool_parser)
                            if isinstance(request, ChatCompletionRequest) else None)
        self.tool_streams: dict[int, ToolCallStream] = {}
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        self.base = {"id": response_id, "object": kind, "created": int(time.time()), "model": model}
        self.text_of = text_of
        self.offsets: dict[int, int] = {}  # completions logprobs: text offset per choice
        self.echo = isinstance(request, CompletionRequest) and request.echo

    def _chunk(self, choice: dict[str, Any]) -> str:
        return sse({**self.base, "choices": [choice]})

    def role(self, index: int) -> str:
        """Chat streams open each choice with the assistant role, as OpenAI's do."""
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def delta(self, state: Choice, new: Delta) -> str:
        """The chunk for what `new` added to `state` (already folded in)."""
        want = self.request.logprobs_k()[1] is not None
        finish = {"finish_reason": state.finish_reason if new.finished else None}
        if new.finished:
            finish["stop_reason"] = state.stop_reason
            if self.request.scores_only:
                finish = {"finish_reason": "length", "stop_reason": None}
        if self.chat:
            delta, called = self._chat_delta(state.index, new)
            if called and finish["finish_reason"] == "stop":
                finish["finish_reason"] = "tool_calls"
            lp = None
            if want:
                lp = {"content": [chat_logprob(x, self.text_of) for x in new.logprobs]}
            choice = {"index": state.index, "delta": delta, "logprobs": lp, **finish}
        else:
            choice = {"index": state.index, **self._completion_delta(state, new, want), **finish}
        if self.request.return_token_ids:
            choice["token_ids"] = list(new.token_ids)
        return self._chunk(choice)

    def _chat_delta(self, index: int, new: Delta) -> tuple[dict[str, Any], bool]:
        """A chat chunk's delta, and whether the choice has called a tool so far."""
        if self.tool_parser is None:
            return ({"content": new.text} if new.text else {}), False
        stream = self.tool_streams.setdefault(index, ToolCallStream(self.tool_parser))
        return stream.feed(new.text, new.finished), stream.called

    def _completion_delta(self, state: Choice, new: Delta, want: bool) -> dict[str, Any]:
        """A completions chunk's text and logprobs; with echo, a choice's first chunk starts with
        the prompt."""
        text, logprobs = new.text, new.logprobs
        # max_tokens 0: the one token run to score the prompt is not shown
        if self.request.scores_only:
            text, logprobs = "", []
        first = self.echo and state.index not in self.offsets
        if first:
            assert isinstance(self.request, CompletionRequest)  # echo is a completions field
            text = _prompt_text(self.request, self.text_of) + text
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
        return {"text": text, "logprobs": lp}

    def usage(self, states: list[Choice]) -> str:
        generated = 0 if self.request.scores_only else sum(len(s.token_ids) for s in states)
        usage = usage_body(len(states[0].prompt_token_ids), generated,
                           max(s.num_cached_tokens for s in states))
        return sse({**self.base, "choices": [], "usage": usage})

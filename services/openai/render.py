"""OpenAI response bodies for /v1/completions and /v1/chat/completions, in vLLM's shapes, made from
plain `Choice` states: the final body (`build_response`), and the pieces the streamed chunks reuse
(logprobs, usage; the chunks themselves are streaming's).

The gateway fills a Choice from worker messages as they arrive; `baton run-batch` fills one from a
finished engine output (`Choice.of`). Each endpoint's request model is its own module.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.completions import CompletionRequest
from baton.services.openai.endpoints import OpenAIRequest, new_response_id
from baton.services.openai.prompt_scoring import vllm_prompt_logprobs
from baton.services.openai.tool_parsers import ToolParser, message_with_calls

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
    """Text of single tokens, as vLLM shows them in logprobs (memoized: top-k repeats ids a lot);
    `as_ids`: vLLM's return_tokens_as_token_ids, every token as "token_id:N", which tells apart
    tokens that decode alike (byte fragments of one character)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
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


def prompt_text(request: CompletionRequest, index: int, text_of: TokenText) -> str:
    """The text of the prompt choice `index` answers (echo)."""
    prompt = request.prompt[index // request.n]
    return prompt if isinstance(prompt, str) else text_of.tokenizer.decode(prompt)


def prompt_tokens(request: OpenAIRequest, choices: list[Choice]) -> int:
    """Usage's prompt tokens: each prompt once (a batch's n choices of one prompt share it)."""
    return sum(len(c.prompt_token_ids) for c in choices[::request.n])


def completion_choice(request: CompletionRequest, c: Choice, index: int,
                      text_of: TokenText) -> dict[str, Any]:
    """A completions response's choice."""
    logprobs = None if c.logprobs is None else completion_logprobs(c.logprobs, text_of)
    text = c.text
    if request.echo:
        text = prompt_text(request, index, text_of) + text
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
    message, called = message_with_calls(c.text, tool_parser, c.finish_reason == "length")
    echoed = request.echo_text()
    if echoed:
        message["content"] = echoed + (message["content"] or "")
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
    text_of = TokenText(tokenizer, bool(request.return_tokens_as_token_ids))
    if request.scores_only:
        choices = [_prompt_only(c) for c in choices]
    if isinstance(request, ChatCompletionRequest):
        parser = request.tool_parser(tool_parser)
        bodies = [chat_choice(request, c, i, text_of, parser) for i, c in enumerate(choices)]
    else:
        bodies = [completion_choice(request, c, i, text_of) for i, c in enumerate(choices)]
    completion_tokens = sum(len(c.token_ids) for c in choices)
    body: dict[str, Any] = {
        "id": response_id or new_response_id(request),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": bodies,
        "usage": usage_body(prompt_tokens(request, choices), completion_tokens,
                            max(c.num_cached_tokens for c in choices)),
    }
    if chat and request.return_token_ids:
        body["prompt_token_ids"] = choices[0].prompt_token_ids
    if chat:  # vLLM puts chat's at the top level, null when not asked for
        body["prompt_logprobs"] = None if request.prompt_logprobs is None else \
            vllm_prompt_logprobs(choices[0].prompt_logprobs or [None], text_of, _clamp)
    return body

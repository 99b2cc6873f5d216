"""OpenAI /v1/completions and /v1/chat/completions: request models and engine inputs.

The response bodies are openai_render's.

Shared by `baton run-batch` and the HTTP gateway. Defaults and meanings follow vLLM's OpenAI server.
A field Baton cannot honour is refused with a 400 that names it, never dropped: a client that asks
for something must learn it did not get it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Literal

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from transformers import PreTrainedTokenizerBase

from baton.services.common.prompt_scoring import parse_logit_bias
from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.services.common.structured_request import (ResponseFormat, StructuredOutputsParams,
                                                      structured_output_of)
from baton.services.common.tool_parsers import (FirstCallOnly, JsonArrayParser, NamedFunctionParser,
                                               ToolParser)
from baton.services.common.tools import (NamedToolChoice, Tool, ToolCall, ToolChoice, forced_output,
                                         tools_problem)

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
# vLLM's completions default (OpenAI's too); chat fills the context instead.
COMPLETION_DEFAULT_MAX_TOKENS = 16


class ProtocolError(ValueError):
    """A request the server refuses, carrying what the OpenAI error body needs."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value",
                 status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {
                "message": self.message, "type": kind, "param": self.param, "code": self.code
            }
        }


def _off(*values: Any) -> Callable[[Any, dict], bool]:
    """Accepts an unsupported field only at a value that asks for nothing (as clients often send
    defaults)."""
    return lambda value, body: value in values


# Known OpenAI/vLLM fields Baton does not implement -> when a value is still acceptable.
_UNSUPPORTED_COMMON: dict[str, Callable[[Any, dict], bool]] = {
    "best_of": lambda value, body: value == body.get("n", 1),
    "use_beam_search": _off(False), "length_penalty": _off(1.0),
    "allowed_token_ids": _off(), "bad_words": _off([]), "logits_processors": _off(),
    "truncate_prompt_tokens": _off(), "spaces_between_special_tokens": _off(True),
    "return_tokens_as_token_ids": _off(False), "guided_decoding_backend": _off(),
    "guided_whitespace_pattern": _off(), "structural_tag": _off(),
    "kv_transfer_params": _off(), "vllm_xargs": _off(), "request_id": _off(), "metadata": _off({}),
    "store": _off(False), "service_tier": _off("auto", "default"),
}
_UNSUPPORTED_COMPLETION = {**_UNSUPPORTED_COMMON, "suffix": _off(""), "prompt_embeds": _off()}
_UNSUPPORTED_CHAT = {
    **_UNSUPPORTED_COMMON,
    "echo": _off(False),
    "functions": _off([]),
    "function_call": _off("none"),
    "audio": _off(),
    "modalities": _off(["text"]),
    "prediction": _off(),
    "web_search_options": _off(),
    "reasoning_effort": _off(),
    "include_reasoning": _off(),
    "chat_template": _off(),
    "chat_template_kwargs": _off({}),
    "documents": _off(),
    "mm_processor_kwargs": _off(),
    "continue_final_message": _off(False),
    "add_generation_prompt": _off(True),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = True  # vLLM's default once stream_options is given


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any, dict], bool]]] = _UNSUPPORTED_COMMON
    PROMPT_FIELD: ClassVar[str] = "prompt"

    model: str | None = None
    n: int = Field(1, ge=1)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: str | None = None  # accepted for compatibility; nothing keys on it
    return_token_ids: bool = False
    priority: int = 0  # vLLM's meaning: lower is served earlier
    cache_salt: str | None = Field(None, min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Structured output (see structured_request): one of these at most.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extra: score the prompt, with this many top-k
    prompt_logprobs: int | None = Field(None, ge=0)

    @classmethod
    def parse(cls, body: Any) -> _Request:
        """Validates a JSON body; raises ProtocolError naming the offending field."""
        if not isinstance(body, dict):
            raise ProtocolError("the request body must be a JSON object", param="body")
        # null means "default" for every field, as in vLLM.
        body = {k: v for k, v in body.items() if v is not None}
        for key in [k for k in body if k not in cls.model_fields]:
            accept = cls.UNSUPPORTED.get(key)
            if accept is None:
                raise ProtocolError(f"unknown field `{key}`", param=key, code="unknown_parameter")
            if not accept(body[key], body):
                shown = repr(body[key]) if len(repr(
                    body[key])) <= 40 else repr(body[key])[:37] + "..."
                raise ProtocolError(
                    f"`{key}` is not supported by this server (got {shown}); omit it", param=key,
                    code="unsupported_parameter")
            del body[key]
        try:
            request = cls.model_validate(body)
        except ValidationError as e:
            raise _from_validation_error(e) from None
        except RecursionError:  # a validator that recurses (jsonschema's, on a tool's schema)
            raise ProtocolError("the request nests too deeply to be validated",
                                code="invalid_json") from None
        request._check()
        return request

    def _check(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ProtocolError("stream_options can only be set when stream is true",
                                param="stream_options")
        # as vLLM: streamed chunks have no place for them
        if self.prompt_logprobs is not None and self.stream:
            raise ProtocolError("prompt_logprobs are not available when stream is true",
                                param="prompt_logprobs")

    def requested_max_tokens(self) -> tuple[str, int | None]:
        """The field that limits the output, and its value (None: fill the context)."""
        return "max_tokens", self.max_tokens

    def tool_constraint(self) -> StructuredOutput | None:
        """The grammar a forced tool choice puts on the output (None: none)."""
        return None

    def prompt_logprobs_k(self) -> int | None:
        """Top-k for the prompt's logprobs (None: the prompt is not scored)."""
        return self.prompt_logprobs

    @property
    def scores_only(self) -> bool:
        """max_tokens 0: only the prompt is wanted (completions with echo)."""
        return False


def _one_prompt(value: Any) -> Any:
    """One prompt: a string or token ids, possibly wrapped in a list of one (vLLM's batched
    form)."""
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        if len(value) > 1:
            raise ValueError(
                f"a list of {len(value)} prompts is not supported; send one prompt per request")
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise ValueError("must be a string or a list of token ids")


class CompletionRequest(_Request):
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any, dict], bool]]] = _UNSUPPORTED_COMPLETION

    prompt: str | list[int]
    max_tokens: int | None = COMPLETION_DEFAULT_MAX_TOKENS
    logprobs: int | None = Field(None, ge=0)
    add_special_tokens: bool = True
    echo: bool = False

    def _check(self) -> None:
        super()._check()
        if self.max_tokens == 0 and not self.echo:
            raise ProtocolError("max_tokens must be at least 1 (0 is allowed only with echo)",
                                param="max_tokens")

    def prompt_logprobs_k(self) -> int | None:
        # echo with logprobs lists the prompt's tokens first, with the same top-k as the answer's.
        echoed = self.logprobs if self.echo else None
        ks = [k for k in (self.prompt_logprobs, echoed) if k is not None]
        return max(ks) if ks else None

    @property
    def scores_only(self) -> bool:
        return self.max_tokens == 0

    @field_validator("prompt", mode="before")
    @classmethod
    def _single_prompt(cls, value: Any) -> Any:
        return _one_prompt(value)

    def prompt_token_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        if isinstance(self.prompt, list):
            return list(self.prompt)
        return tokenizer.encode(self.prompt, add_special_tokens=self.add_special_tokens)

    def logprobs_k(self) -> tuple[str, int | None]:
        """The field that asks for logprobs, and how many top alternatives per token (None: no
        logprobs)."""
        return "logprobs", self.logprobs

class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None  # None only for an assistant message that calls tools
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant only
    tool_call_id: str | None = None  # tool only: the call this message answers

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not self.tool_calls:
            raise ValueError(
                "content is required (it may be null only in an assistant message with tool_calls)")
        return self

    def for_template(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True, exclude={"tool_calls"})
        message.setdefault("content", None)  # templates test it, as for OpenAI's null content
        if self.tool_calls:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        return message

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"),
                                                str) or set(part) - {"type", "text"}:
                raise ValueError(f"content part of type {kind!r} is not supported; only "
                                 '{"type": "text", "text": ...} parts are')
        # vLLM's rendering for templates that take string content, which every template accepts.
        return "\n".join(part["text"] for part in value)


class ChatCompletionRequest(_Request):
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any, dict], bool]]] = _UNSUPPORTED_CHAT
    PROMPT_FIELD: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, else "none"
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    # The template adds BOS and friends itself; adding them again would double them (vLLM's
    # default).
    add_special_tokens: bool = False

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_form(cls, value: Any) -> Any:
        # Checked here so the error names the field, not a member of the union.
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise ValueError(
                f"must be 'none', 'auto', 'required' or a named function, got {value!r}")
        return value

    def _check(self) -> None:
        super()._check()
        if self.top_logprobs and not self.logprobs:
            raise ProtocolError("top_logprobs requires logprobs to be true", param="top_logprobs")
        problem = tools_problem(self.tools, self.tool_choice)
        if problem:
            raise ProtocolError(problem[1], param=problem[0])

    def prompt_token_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        if tokenizer.chat_template is None:
            raise ProtocolError("this model has no chat template; use /v1/completions",
                                param="messages")
        messages = [m.for_template() for m in self.messages]
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        try:
            text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                 tokenize=False)
        # Templates reject what they cannot render, e.g. roles that do not alternate; some fail on a
        # null content (an assistant message that only calls tools) with a TypeError.
        except (TemplateError, TypeError) as e:
            raise ProtocolError(f"messages: the chat template refused them: {e}",
                                param="messages") from None
        return tokenizer.encode(text, add_special_tokens=self.add_special_tokens)

    def requested_max_tokens(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def logprobs_k(self) -> tuple[str, int | None]:
        return "top_logprobs", (self.top_logprobs or 0) if self.logprobs else None

    def tool_constraint(self) -> StructuredOutput | None:
        return forced_output(self.tools or [], self.tool_choice, self.parallel_tool_calls)

    def tool_parser(self, auto: ToolParser | None) -> ToolParser | None:
        """How the output becomes tool calls: a forced choice's constrained shape, the model
        family's format (`auto`) for an auto choice; None when it is plain content."""
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return NamedFunctionParser(self.tool_choice.function.name)
        if self.tool_choice == "required":
            # its grammar already allows one call only, without parallel calls
            return JsonArrayParser()
        return auto if auto is None or self.parallel_tool_calls else FirstCallOnly(auto)

OpenAIRequest = CompletionRequest | ChatCompletionRequest
ENDPOINTS: dict[str, type[_Request]] = {"/v1/completions": CompletionRequest,
                                        "/v1/chat/completions": ChatCompletionRequest}


def parse_request(url: str, body: Any) -> OpenAIRequest:
    """The request model for an endpoint path, validated; raises ProtocolError."""
    cls = ENDPOINTS.get(url)
    if cls is None:
        raise ProtocolError(f"unsupported url {url!r}; expected one of {sorted(ENDPOINTS)}",
                            param="url", code="invalid_url")
    return cls.parse(body)


def _from_validation_error(error: ValidationError) -> ProtocolError:
    first = error.errors()[0]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                    for p in first["loc"]).lstrip(".") or None
    if first["type"] == "extra_forbidden":
        message = f"unknown or unsupported field `{param}`"
    else:
        detail = first["msg"].removeprefix("Value error, ")
        message = f"{param}: {detail}" if param else detail
    return ProtocolError(message, param=param)


@dataclass
class EngineInput:
    """What the engine needs for one API request: the i-th of its n samples runs
    params.for_choice(i)."""
    prompt_token_ids: list[int]
    params: SamplingParams
    n: int
    priority: int  # in the engine's convention: higher is served earlier
    cache_salt: str | None


def to_engine_input(request: OpenAIRequest, tokenizer: PreTrainedTokenizerBase, max_model_len: int,
                    max_logprobs: int = 20, vocab_size: int | None = None) -> EngineInput:
    """Tokenizes the prompt and builds sampling parameters; raises ProtocolError for bad or
    oversized input.
    vocab_size: the model's, which logit_bias ids must fall in (None: the engine checks them)."""
    prompt = request.prompt_token_ids(tokenizer)
    if not prompt:
        raise ProtocolError(f"{request.PROMPT_FIELD} must not be empty", param=request.PROMPT_FIELD)
    try:
        logit_bias = parse_logit_bias(request.logit_bias, vocab_size)
    except ValueError as e:
        raise ProtocolError(str(e), param="logit_bias") from None
    max_tokens = _max_tokens(request, len(prompt), max_model_len)
    # one token still runs, which is what scores the prompt; the answer drops it
    if request.scores_only:
        max_tokens = 1
    logprobs_field, logprobs = request.logprobs_k()
    structured_field, structured = _structured_output(request)
    derived = dict(max_tokens=max_tokens, logprobs=logprobs, logit_bias=logit_bias,
                   prompt_logprobs=request.prompt_logprobs_k(), structured_output=structured)
    # Every other sampling parameter is a request field of the same name and meaning, copied as
    # sent.
    params = SamplingParams(
        **derived, **{
            f.name: getattr(request, f.name)
            for f in fields(SamplingParams) if f.name not in derived
        })
    try:
        params.validate(max_logprobs)
    except ValueError as e:
        # validate() starts its message with the SamplingParams field; report the API field it came
        # from.
        field, _, detail = str(e).partition(" ")
        param = {"logprobs": logprobs_field, "max_tokens": request.requested_max_tokens()[0],
                 "structured_output": structured_field}.get(field, field)
        raise ProtocolError(f"{param} {detail}", param=param) from None
    return EngineInput(prompt, params, request.n, -request.priority, request.cache_salt)


def _structured_output(request: OpenAIRequest) -> tuple[str | None, StructuredOutput | None]:
    """The field that constrains the output and its constraint: a structured-output field or a
    forced tool choice, never both (which one should win is not for the server to guess)."""
    try:
        field, structured = structured_output_of(request)
    except ValueError as e:
        raise ProtocolError(str(e), param=str(e).partition(":")[0]) from None
    forced = request.tool_constraint()
    if forced is None:
        return field, structured
    if structured is not None:
        raise ProtocolError(f"tool_choice: a forced tool call cannot be combined with {field}",
                            param="tool_choice")
    return "tool_choice", forced


def _max_tokens(request: OpenAIRequest, prompt_len: int, max_model_len: int) -> int:
    if prompt_len >= max_model_len:
        raise ProtocolError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request "
            "has "
            f"{prompt_len} input tokens. Please reduce the length of the input.",
            param=request.PROMPT_FIELD, code="context_length_exceeded")
    field, requested = request.requested_max_tokens()
    if requested is None:
        return max_model_len - prompt_len
    if prompt_len + requested > max_model_len:
        raise ProtocolError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            "requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the input, {requested} in the "
            "completion). "
            f"Please reduce the length of the input or of the completion.", param=field,
            code="context_length_exceeded")
    return requested


def new_response_id(request: OpenAIRequest) -> str:
    prefix = "chatcmpl" if isinstance(request, ChatCompletionRequest) else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"

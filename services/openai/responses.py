"""/v1/responses: the request (OpenAI's Responses API) and its input items.

A Responses request is served as the chat completion it amounts to (`ResponsesRequest.chat`): its
conversation (the previous response's, then this request's input items) becomes chat messages,
its function tools, tool_choice and text.format become chat's tools, tool_choice and
response_format. So one chat-template renderer, one tool-call grammar and parser, and one
structured-output path serve both endpoints. The response bodies and stream events are
responses_output's and responses_stream's."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.common import Acceptable, off
from baton.services.openai.errors import ProtocolError, from_validation_error
from baton.services.openai.tools import NAME_PATTERN

ITEM_TYPES = ("message", "function_call", "function_call_output")
# Chat's field names in errors, as this endpoint's.
_PARAMS = {"messages": "input", "response_format": "text.format",
           "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens"}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    status: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        # Checked here so the error names the part's type, not a member of the union.
        for part in value if isinstance(value, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text"):
                raise ValueError(f"content parts of type {kind!r} are not supported; only "
                                 "input_text and output_text parts are")
        return value

    def text(self) -> str:
        """The content as one string, parts joined as chat's text parts are."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(pattern=NAME_PATTERN)
    arguments: str
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(
            part.text for part in self.output)


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem
_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem}


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    def response_format(self) -> dict[str, Any] | None:
        """Chat's response_format for it (None: plain text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.name is None or self.schema_ is None:
            raise ProtocolError("text.format of type json_schema needs a name and a schema",
                                param="text.format")
        spec = {"name": self.name, "schema": self.schema_, "strict": self.strict,
                "description": self.description}
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items()
                                                       if v is not None}}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat = TextFormat(type="text")
    verbosity: Literal["medium"] | None = None  # only the default can be honoured


UNSUPPORTED_RESPONSES: dict[str, Acceptable] = {
    "truncation": off("disabled"), "reasoning": off({}), "service_tier": off("auto", "default"),
    "max_tool_calls": off(), "prompt": off(), "conversation": off(),
    "stream_options": off({}), "safety_identifier": off(),
    "prompt_cache_key": off(), "prompt_cache_retention": off(),
}


# `include` values: the one this server produces, and OpenAI's others (for tools it lacks).
OUTPUT_LOGPROBS = "message.output_text.logprobs"
OTHER_INCLUDES = ("reasoning.encrypted_content", "file_search_call.results",
                  "web_search_call.results", "web_search_call.action.sources",
                  "message.input_image.image_url", "computer_call_output.output.image_url",
                  "code_interpreter_call.outputs")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    UNSUPPORTED: ClassVar[dict[str, Acceptable]] = UNSUPPORTED_RESPONSES

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = TextConfig()
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16)
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1)
    background: bool = False
    stream: bool = False
    user: str | None = None
    include: list[str] = Field(default_factory=list)
    top_logprobs: int = Field(0, ge=0, le=20)

    @field_validator("input", mode="before")
    @classmethod
    def _input_form(cls, value: Any) -> Any:
        if not isinstance(value, (str, list)):
            raise ValueError("must be a string or a list of input items")
        return value

    @classmethod
    def parse(cls, body: Any) -> ResponsesRequest:
        """Validates a JSON body; ProtocolError naming the offending field."""
        if not isinstance(body, dict):
            raise ProtocolError("the request body must be a JSON object", param="body")
        body = {k: v for k, v in body.items() if v is not None}
        for key in [k for k in body if k not in cls.model_fields]:
            accept = cls.UNSUPPORTED.get(key)
            if accept is None:
                raise ProtocolError(f"unknown field `{key}`", param=key, code="unknown_parameter")
            if not accept(body[key], body):
                raise ProtocolError(f"`{key}` is not supported by this server; omit it",
                                    param=key, code="unsupported_parameter")
            del body[key]
        try:
            request = cls.model_validate(body)
        except ValidationError as e:
            raise from_validation_error(e) from None
        request.items()  # refuses bad items now, before anything runs
        request._check()
        return request

    @property
    def logprobs(self) -> bool:
        """Whether output_text parts carry their tokens' logprobs (asking for alternatives implies
        it)."""
        return OUTPUT_LOGPROBS in self.include or self.top_logprobs > 0

    def _check(self) -> None:
        for i, value in enumerate(self.include):
            if value in OTHER_INCLUDES:
                raise ProtocolError(f"include {value!r} is not supported by this server; it "
                                    f"includes only {OUTPUT_LOGPROBS!r}", param=f"include[{i}]",
                                    code="unsupported_parameter")
            if value != OUTPUT_LOGPROBS:
                raise ProtocolError(f"include[{i}]: unknown value {value!r}",
                                    param=f"include[{i}]")
        for key, value in self.metadata.items():
            if len(key) > 64 or len(value) > 512:
                raise ProtocolError("metadata keys are at most 64 characters and values 512",
                                    param="metadata")
        if self.background and not self.store:
            raise ProtocolError("background responses must be stored (store: true)",
                                param="background")
        if self.background and self.stream:
            raise ProtocolError("background responses cannot be streamed by this server; poll "
                                "GET /v1/responses/{id} instead", param="stream",
                                code="unsupported_parameter")

    def items(self) -> list[Item]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        if not self.input:
            raise ProtocolError("input must not be empty", param="input")
        return [parse_item(raw, f"input[{i}]") for i, raw in enumerate(self.input)]

    def chat(self, conversation: list[Item]) -> ChatCompletionRequest:
        """The chat completion this request amounts to, over the whole conversation."""
        messages = ([{"role": "system", "content": self.instructions}]
                    if self.instructions else []) + chat_messages(conversation)
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "temperature": self.temperature,
            "top_p": self.top_p, "stream": self.stream, "user": self.user,
            "max_completion_tokens": self.max_output_tokens,
            "response_format": self.text.format.response_format(),
            "parallel_tool_calls": self.parallel_tool_calls, "metadata": self.metadata or None,
            "logprobs": self.logprobs, "top_logprobs": self.top_logprobs if self.logprobs else None,
        }
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(
                exclude={"type"}, exclude_none=True)} for t in self.tools]
            body["tool_choice"] = self.tool_choice if isinstance(self.tool_choice, str) else {
                "type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice not in ("auto", "none"):
            raise ProtocolError("tool_choice requires tools; none were given", param="tool_choice")
        try:
            return ChatCompletionRequest.parse(body)
        except ProtocolError as e:
            raise renamed(e) from None


def renamed(error: ProtocolError) -> ProtocolError:
    """A chat completion's error in this endpoint's field names."""
    param = error.param
    for chat_name, own in _PARAMS.items():
        if param is not None and (param == chat_name or param.startswith(chat_name + ".")):
            param = own + param[len(chat_name):]
            break
    message = error.message
    for chat_name, own in _PARAMS.items():
        message = message.replace(chat_name, own)
    return ProtocolError(message, param, error.code, error.status)


def parse_item(raw: Any, where: str) -> Item:
    """One input item (a stored one too); ProtocolError naming an unsupported type."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be an object (an input item)", param=where)
    kind = raw.get("type", "message" if "role" in raw else None)
    model = _ITEM_MODELS.get(kind)
    if model is None:
        raise ProtocolError(
            f"{where}: input items of type {kind!r} are not supported; this server takes "
            f"{', '.join(ITEM_TYPES)} items", param=f"{where}.type",
            code="unsupported_item_type")
    try:
        return model.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as e:
        inner = from_validation_error(e)
        param = f"{where}.{inner.param}" if inner.param else where
        raise ProtocolError(f"{where}: {inner.message}", param=param) from None


def chat_messages(items: list[Item]) -> list[dict[str, Any]]:
    """Chat messages for items: function calls in a row become one assistant message's
    tool_calls, each output a tool message."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": item.text()})
    return messages

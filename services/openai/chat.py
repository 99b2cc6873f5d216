"""/v1/chat/completions: the request (messages rendered by the model's chat template, tools and
tool_choice, chat-style logprobs).

Its response bodies are render's, its streamed chunks streaming's."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from transformers import PreTrainedTokenizerBase

from baton.services.common.sampling_params import StructuredOutput
from baton.services.openai.chat_template import (check_generation_flags, check_template_kwargs,
                                                 render_chat)
from baton.services.openai.common import UNSUPPORTED_COMMON, Acceptable, BaseRequest, off
from baton.services.openai.errors import ProtocolError
from baton.services.openai.tool_parsers import (FirstCallOnly, JsonArrayParser,
                                                NamedFunctionParser, ToolParser)
from baton.services.openai.tools import (NamedToolChoice, Tool, ToolCall, ToolChoice, forced_output,
                                         tools_problem)

UNSUPPORTED_CHAT = {
    **UNSUPPORTED_COMMON,
    "functions": off([]),
    "function_call": off("none"),
    "audio": off(),
    "modalities": off(["text"]),
    "prediction": off(),
    "web_search_options": off(),
    "include_reasoning": off(),
    "chat_template": off(),
    "documents": off(),
    "mm_processor_kwargs": off(),
}
# Content parts of other modalities, and what each needs that a text-only model lacks.
MEDIA_PARTS = {"image_url": "images", "input_image": "images", "image": "images",
               "input_audio": "audio", "audio_url": "audio", "video_url": "video",
               "file": "files", "input_file": "files"}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # OpenAI's system, developer, user, assistant and tool, or any other the chat template renders
    # (vLLM passes them through)
    role: str = Field(min_length=1, max_length=64)
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
            if kind in MEDIA_PARTS:
                raise ValueError(f"content part of type {kind!r} cannot be served: this model is "
                                 f"text-only and reads no {MEDIA_PARTS[kind]}")
            if kind != "text" or not isinstance(part.get("text"),
                                                str) or set(part) - {"type", "text"}:
                raise ValueError(f"content part of type {kind!r} is not supported; only "
                                 '{"type": "text", "text": ...} parts are')
        # vLLM's rendering for templates that take string content, which every template accepts.
        return "\n".join(part["text"] for part in value)


class ChatCompletionRequest(BaseRequest):
    UNSUPPORTED: ClassVar[dict[str, Acceptable]] = UNSUPPORTED_CHAT
    PROMPT_FIELD: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, else "none"
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1)  # -1: the whole vocabulary, as vLLM
    # How the template renders the conversation (vLLM's fields); the variables go to the template.
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False  # the answer starts with the last message's content when it continues it
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
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

    _check_kwargs = field_validator("chat_template_kwargs")(check_template_kwargs)

    def _check(self) -> None:
        super()._check()
        if self.top_logprobs and not self.logprobs:
            raise ProtocolError("top_logprobs requires logprobs to be true", param="top_logprobs")
        check_generation_flags(self.add_generation_prompt, self.continue_final_message,
                               self.messages[-1].role)
        problem = tools_problem(self.tools, self.tool_choice)
        if problem:
            raise ProtocolError(problem[1], param=problem[0])

    def prompts_token_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
        """The one prompt: the messages rendered by the chat template."""
        messages = [m.for_template() for m in self.messages]
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        text = render_chat(tokenizer, messages, tools, self.add_generation_prompt,
                           self.continue_final_message, self.template_variables())
        return [tokenizer.encode(text, add_special_tokens=self.add_special_tokens)]

    def template_variables(self) -> dict[str, Any]:
        """What the chat template sees besides messages and tools; chat_template_kwargs win over
        the fields they repeat."""
        fields = {"reasoning_effort": self.reasoning_effort, "verbosity": self.verbosity}
        return {**{k: v for k, v in fields.items() if v is not None},
                **(self.chat_template_kwargs or {})}

    def echo_text(self) -> str:
        """With echo, what the answer starts with (vLLM's rule): the last message's content when
        the answer continues that message's role."""
        last = self.messages[-1]
        role = "assistant" if self.add_generation_prompt else last.role
        return (last.content or "") if self.echo and last.role == role else ""

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

"""vLLM's /tokenize and /detokenize: their requests and answers.

/tokenize takes a prompt (tokenized as /v1/completions tokenizes one) or chat `messages`. Messages
are validated and rendered by `ChatCompletionRequest` itself, the model /v1/chat/completions
parses, so a count from /tokenize is the prompt_tokens the chat request would be billed for, and a
rendering field chat accepts (or refuses) is accepted (or refused) here alike."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, create_model
from transformers import PreTrainedTokenizerBase

from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.errors import ProtocolError, from_validation_error

# vLLM's TokenizeChatRequest fields that shape the rendered prompt; chat's model checks them.
RENDER_FIELDS = ("messages", "tools", "add_generation_prompt", "add_special_tokens",
                 "continue_final_message", "chat_template", "chat_template_kwargs",
                 "mm_processor_kwargs")


class TokenizeOptions(BaseModel):
    """What every /tokenize request may carry besides its prompt."""
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    return_token_strs: bool = False


class TokenizeCompletionRequest(TokenizeOptions):
    prompt: str
    add_special_tokens: bool = True  # as /v1/completions: the tokenizer's BOS and friends


# The documented chat form: chat's own fields of RENDER_FIELDS (whatever chat accepts of them),
# beside the options.
TokenizeChatRequest = create_model(
    "TokenizeChatRequest", __base__=TokenizeOptions,
    **{name: (info.annotation, info)
       for name, info in ChatCompletionRequest.model_fields.items() if name in RENDER_FIELDS})


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[StrictInt] = Field(description="token ids, each in the tokenizer's vocabulary")


class DetokenizeResponse(BaseModel):
    prompt: str


def _validated(cls: type[BaseModel], body: dict[str, Any]) -> Any:
    unknown = [key for key in body if key not in cls.model_fields]
    if unknown:  # named as the completions and chat requests name theirs
        raise ProtocolError(f"unknown field `{unknown[0]}`", param=unknown[0],
                            code="unknown_parameter")
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object", param="body")
    return {k: v for k, v in body.items() if v is not None}  # null means "default", as in vLLM


def tokenize_request(body: Any) -> tuple[TokenizeOptions, ChatCompletionRequest | None]:
    """The options and, for chat messages, the chat request that renders them (None: a prompt,
    in the first value). Raises ProtocolError."""
    body = _object(body)
    if "messages" in body and "prompt" in body:
        raise ProtocolError("send either `prompt` or `messages`, not both", param="messages")
    if "messages" not in body:
        if "prompt" not in body:
            raise ProtocolError("`prompt` (a string) or `messages` (a chat) is required",
                                param="prompt")
        return _validated(TokenizeCompletionRequest, body), None
    options = {k: v for k, v in body.items() if k not in RENDER_FIELDS}
    chat = ChatCompletionRequest.parse({k: v for k, v in body.items() if k in RENDER_FIELDS})
    return _validated(TokenizeOptions, options), chat


def tokenize(options: TokenizeOptions, chat: ChatCompletionRequest | None,
             tokenizer: PreTrainedTokenizerBase, max_model_len: int) -> dict[str, Any]:
    """The /tokenize answer (vLLM's TokenizeResponse)."""
    if chat is not None:
        tokens = chat.prompts_token_ids(tokenizer)[0]
    else:
        assert isinstance(options, TokenizeCompletionRequest)  # tokenize_request's pairing
        tokens = tokenizer.encode(options.prompt, add_special_tokens=options.add_special_tokens)
    strs = tokenizer.convert_ids_to_tokens(tokens) if options.return_token_strs else None
    return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens,
                            token_strs=strs).model_dump()


def detokenize_request(body: Any, vocabulary: int) -> DetokenizeRequest:
    """The request, its ids checked against the tokenizer's `vocabulary` size (ids outside it have
    no text: a 400 rather than a silently shorter prompt)."""
    request = _validated(DetokenizeRequest, _object(body))
    for i, token in enumerate(request.tokens):
        if not 0 <= token < vocabulary:
            raise ProtocolError(
                f"tokens[{i}]: {token} is not a token id of this model's tokenizer (0 to "
                f"{vocabulary - 1})", param=f"tokens[{i}]")
    return request


def detokenize(request: DetokenizeRequest, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The /detokenize answer: the ids' text, special tokens included (as vLLM's)."""
    return DetokenizeResponse(prompt=tokenizer.decode(request.tokens)).model_dump()

"""What every OpenAI endpoint's request shares: the sampling and streaming fields, the structured
output fields, and parsing with its refusals.

Defaults and meanings follow vLLM's OpenAI server. A field Baton cannot honour is refused with a 400
that names it, never dropped: a client that asks for something must learn it did not get it.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError,
                      field_validator)

from baton.services.common.sampling_params import StructuredOutput
from baton.services.openai.errors import ProtocolError, from_validation_error
from baton.services.openai.structured_request import ResponseFormat, StructuredOutputsParams

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
# When a known but unsupported field's value is still acceptable (it asks for nothing).
Acceptable = Callable[[Any, dict], bool]


def off(*values: Any) -> Acceptable:
    """Accepts an unsupported field only at a value that asks for nothing (as clients often send
    defaults)."""
    return lambda value, body: value in values


# Known OpenAI/vLLM fields Baton does not implement -> when a value is still acceptable.
UNSUPPORTED_COMMON: dict[str, Acceptable] = {
    "best_of": lambda value, body: value == body.get("n", 1),
    "use_beam_search": off(False), "length_penalty": off(1.0),
    "allowed_token_ids": off(), "bad_words": off([]), "logits_processors": off(),
    "truncate_prompt_tokens": off(), "spaces_between_special_tokens": off(True),
    "guided_decoding_backend": off(),
    "guided_whitespace_pattern": off(), "structural_tag": off(),
    "kv_transfer_params": off(), "vllm_xargs": off(), "request_id": off(),
    "store": off(False), "service_tier": off("auto", "default"),
}
# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = True  # vLLM's default once stream_options is given
    # vLLM's: every chunk carries the usage so far
    continuous_usage_stats: bool = False


def _metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > METADATA_PAIRS:
        raise ValueError(f"at most {METADATA_PAIRS} key-value pairs, got {len(value)}")
    for key, text in value.items():
        if len(key) > METADATA_KEY or len(text) > METADATA_VALUE:
            raise ValueError(f"keys are at most {METADATA_KEY} characters and values at most "
                             f"{METADATA_VALUE}; `{key[:METADATA_KEY]}` is longer")
    return value


class BaseRequest(BaseModel):
    """The fields and checks completions and chat completions share; each endpoint's request
    subclasses it."""
    model_config = ConfigDict(extra="forbid")
    UNSUPPORTED: ClassVar[dict[str, Acceptable]] = UNSUPPORTED_COMMON
    PROMPT_FIELD: ClassVar[str] = "prompt"
    _ignored: list[str] = PrivateAttr(default_factory=list)

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
    # The tenant's end user (`safety_identifier` is OpenAI's newer name): logged with the request.
    user: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    # OpenAI's prompt-caching hint: requests sharing it go to the same worker (router affinity).
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=1024)
    # Logged with the request's usage; OpenAI keeps it with stored completions, and its chat and
    # completions responses carry none, so neither do these.
    metadata: dict[str, str] | None = None
    # vLLM's: logprobs' tokens as "token_id:N" (None: the server's --return-tokens-as-token-ids)
    return_tokens_as_token_ids: bool | None = None
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
    prompt_logprobs: int | None = Field(None, ge=-1)  # -1: the whole vocabulary, as vLLM

    _check_metadata = field_validator("metadata")(_metadata)

    @classmethod
    def parse(cls, body: Any, strict: bool = False) -> BaseRequest:
        """Validates a JSON body; raises ProtocolError naming the offending field. Fields nobody
        defines are dropped and listed in `ignored_fields` (vLLM's behaviour), or refused when
        `strict`."""
        if not isinstance(body, dict):
            raise ProtocolError("the request body must be a JSON object", param="body")
        # null means "default" for every field, as in vLLM.
        body = {k: v for k, v in body.items() if v is not None}
        ignored: list[str] = []
        for key in [k for k in body if k not in cls.model_fields]:
            accept = cls.UNSUPPORTED.get(key)
            if accept is None and strict:
                raise ProtocolError(f"unknown field `{key}`", param=key, code="unknown_parameter")
            if accept is None:
                ignored.append(key)
                del body[key]
                continue
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
            raise from_validation_error(e) from None
        except RecursionError:  # a validator that recurses (jsonschema's, on a tool's schema)
            raise ProtocolError("the request nests too deeply to be validated",
                                code="invalid_json") from None
        request._check()
        request._ignored = ignored
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
        """Top-k for the prompt's logprobs (None: the prompt is not scored; -1: every token)."""
        return self.prompt_logprobs

    @property
    def ignored_fields(self) -> list[str]:
        """Top-level fields of the body that no OpenAI or vLLM request defines, dropped by parse."""
        return self._ignored

    def end_user(self) -> str | None:
        """Who the tenant says the request is for: `safety_identifier`, else `user`."""
        return self.safety_identifier or self.user

    @property
    def scores_only(self) -> bool:
        """max_tokens 0: only the prompt is wanted (completions with echo)."""
        return False

"""/v1/completions: the request (a prompt as text or token ids, echo, completions-style logprobs).

Its response bodies are render's, its streamed chunks streaming's."""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator
from transformers import PreTrainedTokenizerBase

from baton.services.openai.common import UNSUPPORTED_COMMON, Acceptable, BaseRequest, off
from baton.services.openai.errors import ProtocolError

# vLLM's completions default (OpenAI's too); chat fills the context instead.
COMPLETION_DEFAULT_MAX_TOKENS = 16
UNSUPPORTED_COMPLETION = {**UNSUPPORTED_COMMON, "suffix": off(""), "prompt_embeds": off()}


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def prompt_list(value: Any) -> Any:
    """The prompts of a request: one (a string or token ids) or OpenAI's batch form, a list of
    strings or of token-id lists, each served as its own prompt."""
    if isinstance(value, str) or (_is_token_ids(value) and value):
        return [value]
    if isinstance(value, list) and value and all(
            isinstance(p, str) or _is_token_ids(p) for p in value):
        return value
    raise ValueError("must be a string, a list of token ids, or a non-empty list of either")


class CompletionRequest(BaseRequest):
    UNSUPPORTED: ClassVar[dict[str, Acceptable]] = UNSUPPORTED_COMPLETION

    prompt: list[str | list[int]]  # one or more (the batch form): len(prompt) * n choices
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
    def _prompts(cls, value: Any) -> Any:
        return prompt_list(value)

    def prompts_token_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
        """Each prompt's tokens, in order."""
        return [list(p) if isinstance(p, list) else
                tokenizer.encode(p, add_special_tokens=self.add_special_tokens)
                for p in self.prompt]

    def logprobs_k(self) -> tuple[str, int | None]:
        """The field that asks for logprobs, and how many top alternatives per token (None: no
        logprobs)."""
        return "logprobs", self.logprobs

"""An OpenAI request as engine input: the prompt tokenized (a chat rendered by its template first),
`max_tokens` clamped to the context, logit bias, structured output or a forced tool call, and the
`SamplingParams` of its choices. Shared by the gateway and `baton run-batch`."""
from __future__ import annotations

from dataclasses import dataclass, fields

from transformers import PreTrainedTokenizerBase

from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.services.openai.endpoints import OpenAIRequest
from baton.services.openai.errors import ProtocolError
from baton.services.openai.prompt_scoring import parse_logit_bias
from baton.services.openai.structured_request import structured_output_of


@dataclass
class EngineInput:
    """What the engine needs for one API request: n samples of each prompt (completions take
    several), choice i of prompt p at index p * n + i (OpenAI's order), run with
    params.for_choice(index)."""
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    priority: int  # in the engine's convention: higher is served earlier
    cache_salt: str | None

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    def prompt_of(self, choice: int) -> list[int]:
        return self.prompts[choice // self.n]

    @property
    def prompt_tokens(self) -> int:
        """Every prompt's tokens once, as usage counts them."""
        return sum(len(p) for p in self.prompts)


def to_engine_input(request: OpenAIRequest, tokenizer: PreTrainedTokenizerBase, max_model_len: int,
                    max_logprobs: int = 20, vocab_size: int | None = None) -> EngineInput:
    """Tokenizes the prompt and builds sampling parameters; raises ProtocolError for bad or
    oversized input. max_logprobs -1: no limit.
    vocab_size: the model's, which logit_bias ids must fall in (None: the engine checks them)."""
    prompts = request.prompts_token_ids(tokenizer)
    if not all(prompts):
        raise ProtocolError(f"{request.PROMPT_FIELD} must not be empty", param=request.PROMPT_FIELD)
    try:
        logit_bias = parse_logit_bias(request.logit_bias, vocab_size)
    except ValueError as e:
        raise ProtocolError(str(e), param="logit_bias") from None
    # one limit for all: a batch's max_tokens left unset fills the context after its longest prompt
    max_tokens = _max_tokens(request, max(len(p) for p in prompts), max_model_len)
    # one token still runs, which is what scores the prompt; the answer drops it
    if request.scores_only:
        max_tokens = 1
    logprobs_field, logprobs = request.logprobs_k()
    structured_field, structured = _structured_output(request)
    derived = dict(max_tokens=max_tokens, logit_bias=logit_bias, structured_output=structured,
                   logprobs=_whole_vocabulary(logprobs, logprobs_field, vocab_size),
                   prompt_logprobs=_whole_vocabulary(request.prompt_logprobs_k(),
                                                     "prompt_logprobs", vocab_size))
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
    return EngineInput(prompts, params, request.n, -request.priority, request.cache_salt)


def _whole_vocabulary(k: int | None, field: str, vocab_size: int | None) -> int | None:
    """vLLM's -1 for top logprobs: every token of the vocabulary."""
    if k != -1:
        return k
    if vocab_size is None:
        raise ProtocolError(f"{field} -1 (the whole vocabulary) is not available here",
                            param=field)
    return vocab_size


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

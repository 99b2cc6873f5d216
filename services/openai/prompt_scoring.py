"""The API side of scoring: `logit_bias`, vLLM's `prompt_logprobs`, and completions' `echo` with
`max_tokens` 0, which is how lm-evaluation-harness's `local-completions` asks for
log-likelihoods."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.services.common.outputs import TokenLogprobs

MAX_BIAS = 100.0


def parse_logit_bias(raw: dict[str, float] | None,
                     vocab_size: int | None) -> dict[int, float] | None:
    """OpenAI's map of token-id strings to biases, as engine ids. Raises ValueError naming what is
    wrong."""
    if not raw:
        return None
    bias: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise ValueError(
                f"logit_bias token id {token} is not in the vocabulary [0, {vocab_size})")
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise ValueError(f"logit_bias for token {token} must be in [-100, 100], got {value}")
        bias[token] = float(value)
    return bias


def vllm_prompt_logprobs(entries: list[TokenLogprobs | None], text_of: Callable[[int], str],
                         clamp: Callable[[float], float]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's shape: per prompt position None (the first) or {token id: {logprob, rank,
    decoded_token}}, the prompt's own token first, then the top-k."""
    result: list[dict[str, dict[str, Any]] | None] = []
    for lp in entries:
        if lp is None:
            result.append(None)
            continue
        position = {str(lp.token_id): {"logprob": clamp(lp.logprob), "rank": lp.rank,
                                       "decoded_token": text_of(lp.token_id)}}
        for rank, (token, value) in enumerate(lp.top.items(), start=1):
            position.setdefault(
                str(token),
                {"logprob": clamp(value), "rank": rank, "decoded_token": text_of(token)})
        result.append(position)
    return result

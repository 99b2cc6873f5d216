"""What the engine hands back per request and step."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprobs:
    """Log-probabilities at one generated position, from the model's raw distribution."""
    token_id: int
    logprob: float
    rank: int  # 1-based rank of the chosen token
    top: dict[int, float] = field(default_factory=dict)  # top-k token id -> logprob, best first


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every generated token so far
    text: str  # detokenized output so far, stop string removed when it ended the request
    num_new_tokens: int  # how many of token_ids arrived in this step
    new_text: str  # the text released in this step
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprobs] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # Asked-for prompt logprobs, one per prompt token (the first has none); carried once, by the first output
    # after the whole prompt ran.
    prompt_logprobs: list[TokenLogprobs | None] | None = None

"""Per-request sampling and stopping parameters, with vLLM's defaults and meanings."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from baton.services.common.structured_spec import check_structured

# Below this temperature sampling is greedy, as in vLLM.
GREEDY_EPSILON = 1e-5


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the whole output, enforced token by token by the grammar engine (llguidance).

    kind: "json_object" (value ""), "json_schema" (the schema as a JSON string), "regex", "choice"
    (a JSON list of strings) or "grammar" (an llguidance Lark grammar, which may embed %json{...}).
    Hashable: the compiled grammar cache is keyed by it."""
    kind: str
    value: str = ""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    # top-k logprobs per generated token (the chosen token is always included)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_output: StructuredOutput | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    # logprob of every prompt token given its prefix, plus the top-k
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or
                self.presence_penalty != 0.0)

    def validate(self, max_logprobs: int = 20) -> None:
        """Raises ValueError naming the offending field; callers map it to HTTP 400 /
        INVALID_ARGUMENT. max_logprobs -1: no limit (vLLM's meaning)."""
        cap = max_logprobs if max_logprobs >= 0 else 2 ** 62
        checks = [
            (self.max_tokens >= 1, "max_tokens", f"must be at least 1, got {self.max_tokens}"),
            (0.0 <= self.temperature <= 100.0, "temperature",
             f"must be in [0, 100], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}"),
            # the wire's int32 and uint32 bound what reaches a worker
            (-1 <= self.top_k < 2**31, "top_k",
             f"must be -1, 0 (disabled) or positive (below 2^31), got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}"),
            (0.0 < self.repetition_penalty <= 2.0, "repetition_penalty",
             f"must be in (0, 2], got {self.repetition_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
             f"must be in [-2, 2], got {self.frequency_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
             f"must be in [-2, 2], got {self.presence_penalty}"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens",
             f"must be in [0, max_tokens], got {self.min_tokens}"),
            (self.logprobs is None or 0 <= self.logprobs <= cap, "logprobs",
             f"must be in [0, {max_logprobs}], got {self.logprobs}"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= cap,
             "prompt_logprobs", f"must be in [0, {max_logprobs}], got {self.prompt_logprobs}"),
            (all(t >= 0 and -100.0 <= b <= 100.0 for t, b in (self.logit_bias or {}).items()),
             "logit_bias", "token ids must be non-negative and biases in [-100, 100]"),
            (all(isinstance(s, str) and s
                 for s in self.stop), "stop", "stop strings must be non-empty strings"),
            (all(isinstance(t, int) and 0 <= t < 2**32
                 for t in self.stop_token_ids), "stop_token_ids", "must be non-negative token ids"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name} {message}")
        if self.structured_output is not None:
            check_structured(self.structured_output.kind, self.structured_output.value)

    def for_choice(self, index: int) -> "SamplingParams":
        """Parameters of the index-th of n parallel samples: seeds are offset so choices differ but
        reproduce."""
        return replace(self, seed=None if self.seed is None else self.seed + index)

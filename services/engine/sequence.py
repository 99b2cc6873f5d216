"""A request's state inside the engine."""
from __future__ import annotations

import enum
import time

import torch

from baton.services.common.block_hash import block_hashes
from baton.services.common.outputs import TokenLogprobs
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.structured.matcher import GrammarState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    LOADING = "loading"  # its prefix is being copied in from a KV tier (kv/tiers)
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens; the scheduler advances `num_computed_tokens` through them chunk
    by chunk."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                 priority: int = 0, cache_salt: str | None = None,
                 arrival_time: float | None = None, output_token_ids: list[int] | None = None,
                 hold_kv: bool = False, lora_name: str | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        # prompt + output; output may start non-empty when a request continues elsewhere (migration)
        self.token_ids = list(prompt_token_ids) + list(output_token_ids or ())
        # Keep the KV blocks after finishing, for a decode worker to pull (the prefill side of a
        # hand-off).
        self.hold_kv = hold_kv
        self.params = params
        self.priority = priority
        self.cache_salt = cache_salt
        # The LoRA adapter the request runs under (None: the base model), and the device slot it
        # holds while admitted (services/engine/lora/manager.py).
        self.lora_name = lora_name
        self.lora_slot: int | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        # prompt tokens that came from the prefix cache on first admission
        self.num_cached_tokens = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # keys of this sequence's full blocks, computed lazily
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        # Set by the engine for a request with a structured_output: where its output stands in the
        # grammar.
        self.grammar: GrammarState | None = None
        # Entry i scores prompt token i given tokens before it; the first prompt token has no prefix
        # to score by.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = \
            [None] if params.prompt_logprobs is not None else None
        self.prompt_logprobs_sent = False
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # Set by the detokenizer.
        self.text = ""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.prompt_logprobs is not None

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    def full_block_hashes(self, block_size: int, model_id: str) -> list[int]:
        """Keys of every full block of token_ids, extending the memoized chain as the sequence
        grows."""
        have = len(self.block_hashes)
        if have < self.num_tokens // block_size:
            parent = self.block_hashes[-1] if have else None
            self.block_hashes += block_hashes(self.token_ids, block_size, model_id, self.cache_salt,
                                              start=have, parent=parent, lora_name=self.lora_name)
        return self.block_hashes

    def sort_key(self) -> tuple[int, float]:
        """Higher priority first, then first come first served."""
        return (-self.priority, self.arrival_time)

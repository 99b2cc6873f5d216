"""The one interface every filter and scorer implements, and the request facts they see."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from baton.services.router.worker_state import WorkerState

if TYPE_CHECKING:
    from baton.services.router.config import RouterConfig


@dataclass
class SchedulingRequest:
    """One placement question. `cached_blocks` maps worker id -> leading prompt blocks that worker
    holds in its device cache (from the prefix index); `tier_blocks` what the blocks continuing
    that run in its KV tiers are worth, in device-cached blocks (tier_value.py); `now` is read once
    per decision so every plugin judges staleness against the same instant."""
    request_id: str
    prompt_tokens: int
    block_size: int
    now: float
    cached_blocks: dict[str, int] = field(default_factory=dict)
    tenant: str = ""
    priority: int = 0
    # where the request's affinity key (prompt_cache_key) last went (services/router/affinity_keys)
    affinity_workers: frozenset[str] = frozenset()
    lora_name: str | None = None  # the request's LoRA adapter; None: the base model
    tier_blocks: dict[str, float] = field(default_factory=dict)

    def cached_tokens(self, worker_id: str) -> int:
        return min(self.prompt_tokens, self.cached_blocks.get(worker_id, 0) * self.block_size)

    def uncached_tokens(self, worker_id: str) -> int:
        """Prompt tokens the worker would have to compute itself."""
        return self.prompt_tokens - self.cached_tokens(worker_id)

    def prefill_work_tokens(self, worker_id: str) -> float:
        """The prefill work the prompt costs the worker, in prompt tokens: its uncached tokens, less
        what its KV tiers save (a tier block loads for part of a computed block's cost). The
        device blocks it needs are still uncached_tokens'."""
        saved = self.tier_blocks.get(worker_id, 0.0) * self.block_size
        return max(0.0, self.uncached_tokens(worker_id) - saved)

    def warm_tokens(self, worker_id: str) -> float:
        """Prompt tokens the worker need not compute: its cached ones and its tier blocks' worth."""
        return self.prompt_tokens - self.prefill_work_tokens(worker_id)


class Filter(abc.ABC):
    name: str = "filter"

    @abc.abstractmethod
    def keep(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        """False drops the worker from this decision."""


class Scorer(abc.ABC):
    name: str = "scorer"
    # Affinity scorers rank by what a worker holds rather than how busy it is; the picker drops them
    # when it spreads load, or a warm worker past its threshold would keep winning on its cache
    # alone.
    affinity: bool = False

    def __init__(self, weight: float) -> None:
        self.weight = weight

    @classmethod
    def from_config(cls, weight: float, config: RouterConfig) -> Scorer:
        """The scorer as `RouterConfig.scorers` names it; scorers with thresholds read them here."""
        return cls(weight)

    @abc.abstractmethod
    def score(self, request: SchedulingRequest, worker: WorkerState) -> float:
        """How good the worker is for the request, in [0, 1] (1 best)."""

    def pins(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        """Whether the request asks for this worker by itself (an affinity key): the picker then
        keeps it there while the worker is below the sticky threshold, as for a cached prefix."""
        return False

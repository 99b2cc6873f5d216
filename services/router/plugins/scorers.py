"""Scorers, each in [0, 1] with 1 best. Load scorers give a worker with stale stats 0: the router
cannot tell how busy it is, so it is treated as saturated rather than as idle."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from baton.services.router.plugins.base import Scorer, SchedulingRequest
from baton.services.router.plugins.registry import register_scorer
from baton.services.router.worker_state import WorkerState

if TYPE_CHECKING:
    from baton.services.router.config import RouterConfig


@register_scorer
class PrefixOverlapScorer(Scorer):
    """Share of the prompt the worker already holds: 1 - its prefill work / prompt tokens, where a
    block in its KV tiers counts as part of a cached one by measured load cost (tier_value.py), so
    a host hit scores below a device hit and above a miss."""
    name = "prefix_overlap"
    affinity = True

    def score(self, request: SchedulingRequest, worker: WorkerState) -> float:
        if request.prompt_tokens == 0:
            return 1.0
        return 1.0 - request.prefill_work_tokens(worker.worker_id) / request.prompt_tokens


@register_scorer
class AffinityKeyScorer(Scorer):
    """1 for the workers the request's affinity key (prompt_cache_key) last went to, else 0; and it
    pins the request there (sticky until saturated, as for a cached prefix)."""
    name = "affinity_key"
    affinity = True

    def score(self, request: SchedulingRequest, worker: WorkerState) -> float:
        return 1.0 if worker.worker_id in request.affinity_workers else 0.0

    def pins(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return worker.worker_id in request.affinity_workers


class _LoadScorer(Scorer):
    def __init__(self, weight: float, max_stats_age_s: float) -> None:
        super().__init__(weight)
        self.max_stats_age_s = max_stats_age_s

    @classmethod
    def from_config(cls, weight: float, config: RouterConfig) -> Scorer:
        return cls(weight, config.stats_max_age_s)

    def score(self, request: SchedulingRequest, worker: WorkerState) -> float:
        if worker.is_stale(request.now, self.max_stats_age_s):
            return 0.0
        return min(1.0, max(0.0, self._fresh_score(worker)))

    @abc.abstractmethod
    def _fresh_score(self, worker: WorkerState) -> float:
        """The score from fresh stats (clamped to [0, 1] by the caller)."""


@register_scorer
class KVUtilizationScorer(_LoadScorer):
    """Free share of the KV cache, counting blocks this router's unseen placements will take."""
    name = "kv_utilization"

    def _fresh_score(self, worker: WorkerState) -> float:
        return 1.0 - worker.kv_utilization()


@register_scorer
class QueuedPrefillTokensScorer(_LoadScorer):
    """Falls linearly from 1 (nothing queued) to 0 at `saturation_tokens` queued prompt tokens."""
    name = "queued_prefill_tokens"

    def __init__(self, weight: float, max_stats_age_s: float, saturation_tokens: int) -> None:
        super().__init__(weight, max_stats_age_s)
        self.saturation_tokens = saturation_tokens

    @classmethod
    def from_config(cls, weight: float, config: RouterConfig) -> Scorer:
        return cls(weight, config.stats_max_age_s, config.saturation_queued_prefill_tokens)

    def _fresh_score(self, worker: WorkerState) -> float:
        return 1.0 - worker.queued_prefill_tokens() / self.saturation_tokens


@register_scorer
class InFlightRequestsScorer(_LoadScorer):
    """Falls linearly from 1 (idle) to 0 at `saturation_requests` running, waiting or just placed
    requests."""
    name = "inflight_requests"

    def __init__(self, weight: float, max_stats_age_s: float, saturation_requests: int) -> None:
        super().__init__(weight, max_stats_age_s)
        self.saturation_requests = saturation_requests

    @classmethod
    def from_config(cls, weight: float, config: RouterConfig) -> Scorer:
        return cls(weight, config.stats_max_age_s, config.saturation_inflight_requests)

    def _fresh_score(self, worker: WorkerState) -> float:
        return 1.0 - worker.inflight_requests() / self.saturation_requests


@register_scorer
class LoRAAffinityScorer(Scorer):
    """For a request under a LoRA adapter: 1 where the worker has the adapter in a device slot (it
    runs at once), 0.5 where the worker serves it but would load it first (maybe evicting another
    adapter), 0 where it does not serve it. A base-model request scores 1 everywhere, so it changes
    no choice. As llm-d's and AIBrix's adapter-aware routing."""
    name = "lora_affinity"

    def score(self, request: SchedulingRequest, worker: WorkerState) -> float:
        if request.lora_name is None:
            return 1.0
        report = worker.report
        if report is None:
            return 0.0
        if request.lora_name in report.loaded_loras:
            return 1.0
        return 0.5 if request.lora_name in report.lora_adapters else 0.0

"""Chooses one worker: "sticky until saturated" prefix affinity, then the best weighted score.

Affinity first, because a cache hit saves the whole prefill of the shared prefix; but only while the
warm worker keeps up, since every router replica sends the same prefix to the same worker and it
would otherwise take the whole burst. Past the threshold the next-warmest worker below it is tried,
and when none is left the request goes where the load scorers alone say (with the prefix scorer in,
the warm worker would win on its cache until saturated). Scores within `tie_tolerance` of the best
are ties and one is drawn with a seeded RNG: deterministic picks among equals would send every
replica's traffic to the same worker.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from baton.services.router.plugins.base import Filter, Scorer, SchedulingRequest
from baton.services.router.worker_state import SaturationLimits, WorkerState


@dataclass(frozen=True)
class StickyPolicy:
    # Past either bound the warm worker stops attracting its prefix. Requests count as well as
    # tokens because cache hits queue almost no prefill: a hot prefix would otherwise pile its whole
    # burst onto one decode worker.
    queued_prefill_tokens: int
    inflight_requests: int
    # a prefix shorter than this share of the prompt (a common system prompt) is no reason
    min_cached_fraction: float


@dataclass(frozen=True)
class Pick:
    worker: WorkerState
    score: float
    reason: str  # "prefix_affinity", "load" or "all_saturated"


class Picker:
    def __init__(self, filters: Sequence[Filter], scorers: Sequence[Scorer], sticky: StickyPolicy,
                 limits: SaturationLimits, rng: random.Random, tie_tolerance: float = 1e-6) -> None:
        self.filters = list(filters)
        self.scorers = [s for s in scorers if s.weight > 0]
        self.sticky = sticky
        self.limits = limits
        self.rng = rng
        self.tie_tolerance = tie_tolerance

    def candidates(self, request: SchedulingRequest,
                   workers: Sequence[WorkerState]) -> list[WorkerState]:
        # One filter at a time over a shrinking list: cheaper than every filter per worker
        # (decisions run this for every worker twice), and the same result since filters are
        # independent predicates.
        kept = list(workers)
        for f in self.filters:
            kept = [w for w in kept if f.keep(request, w)]
        return kept

    def total_score(self, request: SchedulingRequest, worker: WorkerState,
                    with_affinity: bool = True) -> float:
        scorers = self.scorers if with_affinity else [s for s in self.scorers if not s.affinity]
        total_weight = sum(s.weight for s in scorers)
        if total_weight == 0:
            return 0.0
        return sum(s.weight * s.score(request, worker) for s in scorers) / total_weight

    def _below_sticky(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return (worker.queued_prefill_tokens() < self.sticky.queued_prefill_tokens
                and worker.inflight_requests() < self.sticky.inflight_requests
                and not worker.is_saturated(request.now, self.limits))

    def _keeps_affinity(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        cached = request.warm_tokens(worker.worker_id)
        return (cached > 0 and cached >= self.sticky.min_cached_fraction * request.prompt_tokens
                and self._below_sticky(request, worker))

    def _warm(self, request: SchedulingRequest, candidates: list[WorkerState]) -> list[WorkerState]:
        """The workers a scorer pins the request to (its affinity key's), else those with the
        longest meaningful cached prefix (a KV tier's blocks counted at their worth); either only
        while below the sticky threshold."""
        pinned = [w for w in candidates if any(s.pins(request, w) for s in self.scorers)
                  and self._below_sticky(request, w)]
        if pinned:
            return pinned
        eligible = [w for w in candidates if self._keeps_affinity(request, w)]
        if not eligible:
            return []
        best = max(request.warm_tokens(w.worker_id) for w in eligible)
        return [w for w in eligible if request.warm_tokens(w.worker_id) == best]

    def pick(self, request: SchedulingRequest, workers: Sequence[WorkerState]) -> Pick | None:
        candidates = self.candidates(request, workers)
        if not candidates:
            return None
        warm = self._warm(request, candidates)
        if warm:
            return self._best(request, warm, "prefix_affinity", with_affinity=True)
        unsaturated = [w for w in candidates if not w.is_saturated(request.now, self.limits)]
        if unsaturated:
            return self._best(request, unsaturated, "load", with_affinity=False)
        return self._best(request, candidates, "all_saturated", with_affinity=False)

    def _best(self, request: SchedulingRequest, pool: list[WorkerState], reason: str,
              with_affinity: bool) -> Pick:
        scored = sorted(((self.total_score(request, w, with_affinity), w.worker_id, w)
                         for w in pool), key=lambda t: t[:2])
        top = scored[-1][0]
        ties = [t for t in scored if t[0] >= top - self.tie_tolerance]
        score, _, worker = ties[0] if len(ties) == 1 else self.rng.choice(ties)
        return Pick(worker, score, reason)

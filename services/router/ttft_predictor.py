"""Predicts time to first token from the prompt tokens queued ahead and each worker's measured
prefill rate.

A worker measures its own rate and sends it with its stats: prompt tokens per second over its recent
steps that computed prompt tokens, decode rows in them included, so batching, chunking and
interference are in it. That is the rate used whenever the worker has reported one: it is fresh from
the first prompt on.

Otherwise the rate is learned from what gateways report on release: a request that found Q prompt
tokens queued on its worker and had U uncached tokens of its own saw its first token after T
seconds, so that worker drained (Q + U) / T tokens per second. An EWMA per worker follows changes
without jumping on one outlier. Releases come only when requests end, so under load this learns
slowly; it stays as the fallback for workers that report none.
"""
from __future__ import annotations

from collections.abc import Iterable


class TTFTPredictor:
    def __init__(self, initial_tokens_per_s: float, alpha: float, overhead_s: float) -> None:
        self.initial_tokens_per_s = initial_tokens_per_s
        self.alpha = alpha
        self.overhead_s = overhead_s
        self._rate: dict[str, float] = {}
        self._measured: dict[str, float] = {}

    def tokens_per_s(self, worker_id: str) -> float:
        return self._measured.get(worker_id) or self._rate.get(worker_id, self.initial_tokens_per_s)

    def measured(self, worker_id: str, tokens_per_s: float) -> None:
        """The worker's own latest measurement (0: it has none yet)."""
        if tokens_per_s > 0:
            self._measured[worker_id] = tokens_per_s

    def pool_tokens_per_s(self, worker_ids: Iterable[str]) -> float:
        """What a set of workers drains together (a router-side queue is served by all of them)."""
        return sum(self.tokens_per_s(w) for w in worker_ids)

    def predict(self, worker_id: str, queued_tokens: int, uncached_tokens: float) -> float:
        return self.overhead_s + (queued_tokens + uncached_tokens) / self.tokens_per_s(worker_id)

    def observe(self, worker_id: str, queued_tokens: int, uncached_tokens: int,
                observed_ttft_s: float) -> None:
        """One measured request; ignored when it says nothing about the rate (no work, or no time
        past overhead)."""
        work = queued_tokens + uncached_tokens
        busy_s = observed_ttft_s - self.overhead_s
        if work <= 0 or busy_s <= 0:
            return
        sample = work / busy_s
        old = self._rate.get(worker_id, self.initial_tokens_per_s)
        self._rate[worker_id] = (1 - self.alpha) * old + self.alpha * sample

    def forget(self, worker_id: str) -> None:
        self._rate.pop(worker_id, None)
        self._measured.pop(worker_id, None)

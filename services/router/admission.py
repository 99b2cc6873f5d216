"""Admission control: refuse early what cannot be served in time, queue the rest fairly while
workers are full.

- Priority is an integer; negative means sheddable (refused outright when every worker is
  saturated). On the decode side (the router's TPOT check) each class has its own share of the TPOT
  SLO: sheddable requests stop joining a decode batch first and critical (positive) ones last.
- The queue is bounded in size and age. It serves the highest priority first; within a priority, the
  tenant that has been served the fewest tokens (start-time fair queueing over tokens, so one
  tenant's long prompts cannot crowd out another's short ones); within a tenant, the earliest
  deadline.
- A request whose predicted TTFT misses its SLO is refused at once with a retry-after hint: serving
  it late would spend capacity on an answer nobody waits for, and delay the requests that can still
  make theirs.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from baton.services.router.metrics import RouterMetrics, priority_class
from baton.services.router.rejections import RejectReason, Rejection


@dataclass(order=True)
class QueuedRequest:
    deadline: float  # absolute (router clock); inf when the request has none
    seq: int  # arrival order breaks deadline ties
    request_id: str = field(compare=False)
    tenant: str = field(compare=False)
    priority: int = field(compare=False)
    cost_tokens: int = field(compare=False)
    enqueued_at: float = field(compare=False)
    payload: Any = field(compare=False, default=None)


class FairShare:
    """Virtual time per tenant: tokens served / weight. A tenant that goes idle does not bank
    credit: when it has work again it starts no earlier than the least-served tenant that stayed
    busy."""

    def __init__(self, weights: dict[str, float] | None = None,
                 default_weight: float = 1.0) -> None:
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self._vtime: dict[str, float] = {}

    def vtime(self, tenant: str) -> float:
        return self._vtime.get(tenant, 0.0)

    def charge(self, tenant: str, tokens: float) -> None:
        self._vtime[tenant] = self.vtime(tenant) + tokens / self.weights.get(
            tenant, self.default_weight)

    def catch_up(self, tenant: str, busy_tenants: list[str]) -> None:
        floor = min((self.vtime(t) for t in busy_tenants),
                    default=max(self._vtime.values(), default=0.0))
        self._vtime[tenant] = max(self.vtime(tenant), floor)


class AdmissionQueue:
    def __init__(self, max_size: int, max_age_s: float, fair_share: FairShare) -> None:
        self.max_size = max_size
        self.max_age_s = max_age_s
        self.fair_share = fair_share
        # priority -> tenant -> heap of (deadline, seq) ordered requests
        self._bands: dict[int, dict[str, list[QueuedRequest]]] = {}
        self._band_tokens: dict[int, int] = {}
        self._size = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._size

    def make(self, request_id: str, tenant: str, priority: int, cost_tokens: int, now: float,
             deadline: float = float("inf"), payload: Any = None) -> QueuedRequest:
        return QueuedRequest(deadline, next(self._seq), request_id, tenant, priority, cost_tokens,
                             now, payload)

    def push(self, item: QueuedRequest) -> tuple[bool, QueuedRequest | None]:
        """(accepted, displaced): a full queue displaces its least urgent entry for a strictly
        higher priority."""
        displaced = None
        if self._size >= self.max_size:
            victim = self._least_urgent()
            if victim is None or victim.priority >= item.priority:
                return False, None
            self.remove(victim)
            displaced = victim
        band = self._bands.setdefault(item.priority, {})
        if item.tenant not in band:
            self.fair_share.catch_up(item.tenant, list(band))
            band[item.tenant] = []
        heapq.heappush(band[item.tenant], item)
        self._band_tokens[item.priority] = self._band_tokens.get(item.priority,
                                                                 0) + item.cost_tokens
        self._size += 1
        return True, displaced

    def _least_urgent(self) -> QueuedRequest | None:
        if not self._bands:
            return None
        band = self._bands[min(self._bands)]
        return max((i for heap in band.values() for i in heap), key=lambda i: (i.deadline, i.seq))

    def peek(self) -> QueuedRequest | None:
        """Next to serve: top priority, then the least-served tenant, then the earliest deadline."""
        if not self._bands:
            return None
        band = self._bands[max(self._bands)]
        tenant = min(band, key=lambda t: (self.fair_share.vtime(t), t))
        return band[tenant][0]

    def remove(self, item: QueuedRequest) -> None:
        band = self._bands[item.priority]
        heap = band[item.tenant]
        heap.remove(item)
        heapq.heapify(heap)
        if not heap:
            del band[item.tenant]
        if not band:
            del self._bands[item.priority]
        self._band_tokens[item.priority] -= item.cost_tokens
        self._size -= 1

    def tokens_ahead(self, priority: int) -> int:
        """Queued tokens that would be served before a new request of this priority."""
        return sum(tokens for p, tokens in self._band_tokens.items() if p >= priority)

    def expired(self, now: float) -> list[tuple[QueuedRequest, RejectReason]]:
        """Removes and returns entries past the age bound or their deadline."""
        out = []
        for band in list(self._bands.values()):
            for heap in list(band.values()):
                for item in list(heap):
                    if now >= item.deadline:
                        out.append((item, RejectReason.DEADLINE))
                    elif now - item.enqueued_at >= self.max_age_s:
                        out.append((item, RejectReason.QUEUE_TIMEOUT))
        for item, _ in out:
            self.remove(item)
        return out


@dataclass(frozen=True)
class RetryPolicy:
    min_s: float
    max_s: float

    def hint(self, seconds: float) -> float:
        return min(self.max_s, max(self.min_s, seconds))


class Admission:
    """The one place rejections are made, so every one is counted under its reason."""

    def __init__(self, queue: AdmissionQueue, retry: RetryPolicy, metrics: RouterMetrics,
                 slo_headroom: float = 1.0) -> None:
        self.queue = queue
        self.retry = retry
        self.metrics = metrics
        self.slo_headroom = slo_headroom

    def reject(self, request_id: str, reason: RejectReason, message: str,
               retry_after_s: float | None = None) -> Rejection:
        self.metrics.rejections.labels(reason.value).inc()
        self.metrics.decisions.labels("rejected", reason.value).inc()
        hint = None if retry_after_s is None else self.retry.hint(retry_after_s)
        return Rejection(request_id, reason, message, hint)

    def check_slo(self, request_id: str, predicted_ttft_s: float,
                  slo_s: float | None) -> Rejection | None:
        """Refuses when the prediction misses the SLO less its headroom (the predictor errs both
        ways, and a request admitted at the edge lands late as often as not); retry after the excess
        has had time to drain."""
        if slo_s is None or predicted_ttft_s <= slo_s * self.slo_headroom:
            return None
        return self.reject(
            request_id, RejectReason.TTFT_SLO,
            f"predicted time to first token {predicted_ttft_s:.3f}s exceeds the SLO of "
            f"{slo_s:.3f}s "
            f"less {1 - self.slo_headroom:.0%} headroom",
            predicted_ttft_s - slo_s * self.slo_headroom)

    def observe_queue_time(self, item: QueuedRequest, now: float) -> None:
        self.metrics.queue_time.labels(priority_class(item.priority)).observe(now -
                                                                              item.enqueued_at)

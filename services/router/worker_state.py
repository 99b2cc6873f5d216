"""The router's view of one worker: its last reported load, the work this router placed there since,
and whether it may receive anything new (registration lease, circuit breaker, draining).

Active-active replicas each count only their own reservations. A reservation stops adding load once
the worker reports stats taken after it was placed, because from then on the worker's own numbers
include it; this assumes router and worker clocks agree to well within a stats period (NTP), which
is also what the staleness bound needs.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from baton.services.common.messages.worker import LoadReport
from baton.services.common.roles import Role


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after `failure_threshold` consecutive failures; after `cooldown_s` lets one probe
    through (half-open), whose success closes it and whose failure opens it for another cooldown."""

    def __init__(self, failure_threshold: int, cooldown_s: float) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.consecutive_failures = 0
        self._opened_at: float | None = None
        self._probe_in_flight = False

    def state(self, now: float) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if now - self._opened_at < self.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self, now: float) -> bool:
        state = self.state(now)
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and
                                                not self._probe_in_flight)

    def on_placed(self, now: float) -> None:
        # Only one request probes a half-open worker; the rest wait for its verdict.
        if self.state(now) is BreakerState.HALF_OPEN:
            self._probe_in_flight = True

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self._opened_at = None
        self._probe_in_flight = False

    def record_failure(self, now: float) -> None:
        self.consecutive_failures += 1
        half_open = self.state(now) is BreakerState.HALF_OPEN
        if half_open or self.consecutive_failures >= self.failure_threshold:
            self._opened_at = now
        self._probe_in_flight = False


@dataclass(frozen=True)
class SaturationLimits:
    """Past any of these a worker counts as saturated: new work would only queue behind old work
    there."""
    max_stats_age_s: float
    queued_prefill_tokens: int
    inflight_requests: int
    kv_utilization: float


@dataclass
class _Reservation:
    placed_at: float
    prefill_tokens: int
    kv_blocks: int
    # what the request adds to the worker's decode batch (0: it decodes elsewhere)
    context_tokens: int = 0


@dataclass
class WorkerState:
    worker_id: str
    address: str
    role: Role
    breaker: CircuitBreaker
    lease_expires_at: float = float("inf")
    draining: bool = False
    report: LoadReport | None = None
    model: str = ""  # the base model it serves (with its adapters); requests for it only go here
    # runtime LoRA adapters this router saw loaded here, and when (services/router/runtime_loras.py)
    lora_confirmed: dict[str, float] = field(default_factory=dict)
    # This router's outstanding reservations (lease id -> reservation); the unseen ones (placed
    # after the last report) are kept apart, oldest first, with running sums so a decision never
    # walks them.
    _reservations: dict[str, _Reservation] = field(default_factory=dict)
    _unseen: "OrderedDict[str, _Reservation]" = field(default_factory=OrderedDict)
    _unseen_tokens: int = 0
    _unseen_blocks: int = 0
    _unseen_rows: int = 0
    _unseen_context: int = 0

    def on_stats(self, report: LoadReport, grace_s: float = 0.0) -> None:
        """A new report; reservations placed at least grace_s before it was taken stop counting,
        since by then the request has reached the worker (the gateway's call to it takes time after
        the placement)."""
        # Out-of-order stats (two streams, a retry) must not roll the view back.
        if self.report is not None and report.timestamp_s < self.report.timestamp_s:
            return
        self.report = report
        while self._unseen:
            lease_id, res = next(iter(self._unseen.items()))
            if res.placed_at + grace_s >= report.timestamp_s:  # the report may not include it yet
                break
            self._forget_unseen(lease_id)

    def stats_age(self, now: float) -> float:
        if self.report is None:
            return float("inf")
        return max(0.0, now - self.report.timestamp_s)

    def is_stale(self, now: float, max_age_s: float) -> bool:
        return self.stats_age(now) > max_age_s

    def is_alive(self, now: float) -> bool:
        return now < self.lease_expires_at

    def is_draining(self) -> bool:
        return self.draining or (self.report is not None and self.report.draining)

    def reserve(self, lease_id: str, now: float, prefill_tokens: int, kv_blocks: int,
                context_tokens: int = 0) -> None:
        res = _Reservation(now, prefill_tokens, kv_blocks, context_tokens)
        self._reservations[lease_id] = res
        self._unseen[lease_id] = res
        self._unseen_tokens += prefill_tokens
        self._unseen_blocks += kv_blocks
        self._unseen_rows += context_tokens > 0
        self._unseen_context += context_tokens

    def unreserve(self, lease_id: str) -> None:
        if self._reservations.pop(lease_id, None) is not None:
            self._forget_unseen(lease_id)

    def _forget_unseen(self, lease_id: str) -> None:
        res = self._unseen.pop(lease_id, None)
        if res is not None:
            self._unseen_tokens -= res.prefill_tokens
            self._unseen_blocks -= res.kv_blocks
            self._unseen_rows -= res.context_tokens > 0
            self._unseen_context -= res.context_tokens

    def decode_batch(self) -> tuple[int, int]:
        """(rows, context tokens) of the decode batch: the reported one plus this router's unseen
        placements."""
        rows = self.report.decode_rows if self.report is not None else 0
        tokens = self.report.decode_context_tokens if self.report is not None else 0
        return rows + self._unseen_rows, tokens + self._unseen_context

    @property
    def outstanding_requests(self) -> int:
        return len(self._reservations)

    def queued_prefill_tokens(self) -> int:
        reported = self.report.prefill_tokens_queued if self.report is not None else 0
        return reported + self._unseen_tokens

    def inflight_requests(self) -> int:
        reported = (self.report.num_running +
                    self.report.num_waiting if self.report is not None else 0)
        return reported + len(self._unseen)

    def kv_utilization(self) -> float:
        """Used share of the KV cache, counting blocks this router's unseen placements will take; 1
        when unknown."""
        if self.report is None or self.report.kv_blocks_total == 0:
            return 1.0
        return min(1.0,
                   (self.report.kv_blocks_used + self._unseen_blocks) / self.report.kv_blocks_total)

    def free_kv_blocks(self) -> int:
        if self.report is None:
            return 0
        return max(0,
                   self.report.kv_blocks_total - self.report.kv_blocks_used - self._unseen_blocks)

    def is_saturated(self, now: float, limits: SaturationLimits) -> bool:
        return (self.is_stale(now, limits.max_stats_age_s)
                or self.queued_prefill_tokens() >= limits.queued_prefill_tokens
                or self.inflight_requests() >= limits.inflight_requests
                or self.kv_utilization() >= limits.kv_utilization)

from __future__ import annotations

import pytest

from baton.services.common.roles import Role
from baton.services.router.worker_state import BreakerState, CircuitBreaker
from baton.v1 import worker_pb2

from .helpers import LIMITS, report, worker


def test_roles_match_the_worker_contract():
    assert [Role.PREFILL, Role.DECODE,
            Role.MIXED] == [worker_pb2.ROLE_PREFILL, worker_pb2.ROLE_DECODE, worker_pb2.ROLE_MIXED]


@pytest.mark.parametrize("report_at, now, stale", [
    (None, 100.0, True),  # never reported
    (100.0, 101.0, False),
    (100.0, 102.0, False),  # exactly at the bound
    (100.0, 102.5, True),
    (105.0, 100.0, False),  # worker clock slightly ahead: age clamps at 0
])
def test_stale_stats_count_as_saturated(report_at, now, stale):
    w = worker("w", at=report_at)
    assert w.is_stale(now, LIMITS.max_stats_age_s) is stale
    assert w.is_saturated(now, LIMITS) is stale


@pytest.mark.parametrize("load, saturated", [
    ({"queued": 9_999}, False),
    ({"queued": 10_000}, True),
    ({"running": 60, "waiting": 40}, True),
    ({"kv_used": 949}, False),
    ({"kv_used": 950}, True),
    ({"kv_total": 0}, True),  # a cache of unknown size is not room
])
def test_saturation_thresholds(load, saturated):
    assert worker("w", at=100.0, **load).is_saturated(100.5, LIMITS) is saturated


def test_reservations_count_until_a_later_report_includes_them():
    w = worker("w", at=100.0, queued=1000, running=2, kv_used=100)
    w.reserve("l1", 100.5, prefill_tokens=500, kv_blocks=10)
    w.reserve("l2", 101.0, prefill_tokens=300, kv_blocks=5)
    assert (w.queued_prefill_tokens(), w.inflight_requests(), w.free_kv_blocks()) == (1800, 4, 885)
    # The worker's report at 100.7 already holds l1 (its own numbers say so); l2 came after it.
    w.on_stats(report("w", 100.7, queued=1400, running=3, kv_used=110))
    assert (w.queued_prefill_tokens(), w.inflight_requests(), w.free_kv_blocks()) == (1700, 4, 885)
    assert w.outstanding_requests == 2
    w.unreserve("l2")
    assert (w.queued_prefill_tokens(), w.inflight_requests(), w.outstanding_requests) == (1400, 3,
                                                                                          1)
    w.unreserve("l2")  # releasing twice changes nothing
    assert w.outstanding_requests == 1


def test_older_report_does_not_roll_the_view_back():
    w = worker("w", at=100.0, queued=50)
    w.on_stats(report("w", 99.0, queued=7))
    assert w.queued_prefill_tokens() == 50


def test_draining_from_either_side():
    assert not worker("w", at=1.0).is_draining()
    assert worker("w", at=1.0, draining=True).is_draining()
    w = worker("w", at=1.0)
    w.draining = True
    assert w.is_draining()


def test_circuit_breaker_opens_after_consecutive_failures_then_probes():
    b = CircuitBreaker(failure_threshold=3, cooldown_s=10.0)
    b.record_failure(0.0)
    b.record_failure(1.0)
    b.record_success()  # consecutive: a success in between resets the count
    b.record_failure(2.0)
    b.record_failure(3.0)
    assert b.state(3.0) is BreakerState.CLOSED and b.allows(3.0)
    b.record_failure(4.0)
    assert b.state(4.0) is BreakerState.OPEN and not b.allows(13.9)
    assert b.state(14.0) is BreakerState.HALF_OPEN and b.allows(14.0)
    b.on_placed(14.0)
    assert not b.allows(14.1)  # one probe at a time
    b.record_failure(15.0)  # the probe failed: open for another cooldown
    assert b.state(24.9) is BreakerState.OPEN
    b.on_placed(25.0)
    b.record_success()
    assert b.state(25.1) is BreakerState.CLOSED and b.allows(25.1)

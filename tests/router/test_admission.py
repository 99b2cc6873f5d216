from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from baton.services.router.admission import Admission, AdmissionQueue, FairShare, RetryPolicy
from baton.services.router.metrics import RouterMetrics
from baton.services.router.rejections import RejectReason
from baton.services.router.ttft_predictor import TTFTPredictor

INF = float("inf")


def drain(queue: AdmissionQueue, charge: bool = False) -> list[str]:
    order = []
    while (item := queue.peek()) is not None:
        queue.remove(item)
        if charge:
            queue.fair_share.charge(item.tenant, item.cost_tokens)
        order.append(item.request_id)
    return order


def test_queue_orders_by_priority_then_deadline():
    q = AdmissionQueue(10, 60.0, FairShare())
    for rid, prio, deadline in [("low", -1, 1.0), ("late", 0, 9.0), ("none", 0, INF),
                                ("soon", 0, 2.0), ("high", 5, 50.0)]:
        q.push(q.make(rid, "t", prio, 100, 0.0, deadline))
    assert drain(q) == ["high", "soon", "late", "none", "low"]


def test_fairness_is_counted_in_tokens_not_requests():
    q = AdmissionQueue(100, 60.0, FairShare())
    for i in range(4):
        q.push(q.make(f"big{i}", "big", 0, 4000, 0.0))
    for i in range(8):
        q.push(q.make(f"small{i}", "small", 0, 1000, 0.0))
    order = drain(q, charge=True)
    # Per request the tenants would alternate; per token, "small" gets four requests for each of
    # "big"'s.
    assert order[:6] == ["big0", "small0", "small1", "small2", "small3", "big1"]


def test_returning_tenant_does_not_bank_credit():
    fair = FairShare()
    q = AdmissionQueue(100, 60.0, fair)
    fair.charge("busy", 10_000)
    q.push(q.make("b1", "busy", 0, 100, 0.0))
    q.push(q.make("i1", "idle", 0, 100, 0.0))
    q.push(q.make("i2", "idle", 0, 100, 0.0))
    # "idle" starts at busy's virtual time rather than 0, so it does not get 100 requests in a row.
    assert fair.vtime("idle") == fair.vtime("busy") == 10_000
    assert drain(q, charge=True) == ["b1", "i1", "i2"]


def test_weighted_tenants():
    fair = FairShare(weights={"gold": 2.0})
    fair.charge("gold", 1000)
    fair.charge("basic", 1000)
    assert (fair.vtime("gold"), fair.vtime("basic")) == (500.0, 1000.0)


def test_full_queue_displaces_only_for_higher_priority():
    q = AdmissionQueue(2, 60.0, FairShare())
    assert q.push(q.make("a", "t", 0, 1, 0.0, 5.0)) == (True, None)
    assert q.push(q.make("b", "t", 0, 1, 0.0, 9.0)) == (True, None)
    assert q.push(q.make("c", "t", 0, 1, 0.0, 1.0)) == (False, None)  # same priority: refused
    accepted, displaced = q.push(q.make("d", "t", 1, 1, 0.0, 7.0))
    # the least urgent: lowest priority, latest deadline
    assert accepted and displaced.request_id == "b"
    assert drain(q) == ["d", "a"]


def test_queue_age_and_deadline_bounds():
    q = AdmissionQueue(10, 30.0, FairShare())
    q.push(q.make("old", "t", 0, 1, 0.0))
    q.push(q.make("due", "t", 0, 1, 20.0, 25.0))
    q.push(q.make("fine", "t", 0, 1, 20.0, 100.0))
    assert q.expired(24.9) == []
    expired = {i.request_id: r for i, r in q.expired(30.0)}
    assert expired == {"old": RejectReason.QUEUE_TIMEOUT, "due": RejectReason.DEADLINE}
    assert len(q) == 1 and q.peek().request_id == "fine"


def test_tokens_ahead_counts_equal_or_higher_priority():
    q = AdmissionQueue(10, 30.0, FairShare())
    for prio, tokens in [(-1, 1), (0, 10), (0, 100), (2, 1000)]:
        q.push(q.make(f"r{prio}{tokens}", "t", prio, tokens, 0.0))
    assert [q.tokens_ahead(p) for p in (-5, 0, 1, 3)] == [1111, 1110, 1000, 0]


def _admission() -> tuple[Admission, CollectorRegistry]:
    registry = CollectorRegistry()
    return Admission(AdmissionQueue(10, 30.0, FairShare()), RetryPolicy(0.1, 30.0),
                     RouterMetrics(registry)), registry


@pytest.mark.parametrize("predicted, slo, retry_after", [
    (0.9, 1.0, None),
    (1.0, 1.0, None),
    (5.0, None, None),  # no SLO, no refusal
    (1.5, 1.0, 0.5),  # retry once the excess has drained
    (1.01, 1.0, 0.1),  # clamped to the smallest hint
    (100.0, 1.0, 30.0),  # and the largest
])
def test_ttft_slo_refusal_with_retry_after(predicted, slo, retry_after):
    admission, registry = _admission()
    refusal = admission.check_slo("r", predicted, slo)
    if retry_after is None:
        assert refusal is None
    else:
        assert refusal.reason is RejectReason.TTFT_SLO and refusal.retry_after_s == pytest.approx(
            retry_after)
        assert refusal.reason.grpc_status == "RESOURCE_EXHAUSTED"
    count = registry.get_sample_value("baton_router_rejections_total", {"reason": "ttft_slo"})
    assert count == (0 if retry_after is None else 1)


def test_every_reason_is_exported_from_the_start():
    _, registry = _admission()
    for reason in RejectReason:
        assert registry.get_sample_value("baton_router_rejections_total",
                                         {"reason": reason.value}) == 0
    assert RejectReason.NO_WORKERS.grpc_status == "UNAVAILABLE"


def test_ttft_predictor_learns_rate_with_ewma():
    p = TTFTPredictor(initial_tokens_per_s=1000.0, alpha=0.5, overhead_s=0.1)
    assert p.predict("w", queued_tokens=400, uncached_tokens=600) == pytest.approx(1.1)
    # 2000 tok / 0.5 s = 4000/s
    p.observe("w", queued_tokens=1000, uncached_tokens=1000, observed_ttft_s=0.6)
    assert p.tokens_per_s("w") == pytest.approx(2500.0)
    p.observe("w", 0, 0, 1.0)  # no work: says nothing about the rate
    p.observe("w", 100, 0, 0.05)  # faster than the overhead: also nothing
    assert p.tokens_per_s("w") == pytest.approx(2500.0)
    assert p.pool_tokens_per_s(["w", "other"]) == pytest.approx(3500.0)


def test_a_workers_own_measured_rate_wins_over_what_releases_taught():
    p = TTFTPredictor(initial_tokens_per_s=8000.0, alpha=0.5, overhead_s=0.0)
    p.observe("w", queued_tokens=0, uncached_tokens=4000, observed_ttft_s=1.0)  # EWMA: 6000/s
    p.measured("w", 0.0)  # the worker has computed no prompt yet: nothing to go on
    assert p.tokens_per_s("w") == pytest.approx(6000.0)
    # a slow CPU worker, which a few releases at 8000/s initial would take long to learn
    p.measured("w", 500.0)
    assert p.predict("w", queued_tokens=2000, uncached_tokens=500) == pytest.approx(5.0)
    p.forget("w")
    assert p.tokens_per_s("w") == pytest.approx(8000.0)

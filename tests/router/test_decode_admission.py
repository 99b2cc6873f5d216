"""Decode-side admission: the TPOT a request would see with one more row in a decode worker's batch,
predicted from the worker's reported step-time fit; the decode worker's join wait in the TTFT
prediction; queued deadlines that keep the admission headroom."""
from __future__ import annotations

import pytest

from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.roles import Role
from baton.services.common.wire.router import load_report_from_proto
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.router import Queued

from .helpers import stats
from .test_router import PROMPT, add, make_router

SHORT = PROMPT[:64]


def decode_stats(worker_id: str, at: float, rows: int, base_ms: float = 10.0,
                 per_seq_ms: float = 1.0, per_ktoken_ms: float = 0.0, waiting: int = 0):
    s = stats(worker_id, at, running=rows, waiting=waiting, kv_total=100_000)
    s.decode_step_ms_base, s.decode_step_ms_per_sequence = base_ms, per_seq_ms
    s.decode_step_ms_per_ktoken, s.decode_step_samples = per_ktoken_ms, 32
    s.decode_rows, s.decode_context_tokens = rows, rows * 500
    return load_report_from_proto(s)


def test_decode_worker_whose_batch_would_miss_the_tpot_slo_is_passed_over_then_refused():
    router, clock, _, registry = make_router()
    for w in ("d0", "d1"):
        add(router, clock, w)
    router.on_stats(decode_stats("d0", clock(), rows=60))  # 10 + 61 * 1 = 71 ms with one more row
    router.on_stats(decode_stats("d1", clock(), rows=20))  # 31 ms
    # 80% of 50.5 ms is 40.4 ms: only d1 fits, whatever the scores say.
    for i in range(5):
        assert router.place(PlaceRequest(f"a{i}", SHORT, max_tokens=16,
                                         tpot_slo_s=0.0505)).decode_worker_id == "d1"
    # d1 now counts its 5 unseen rows: the next five take it to 36..40 ms, the five after would see
    # 41..45 ms and are refused at once.
    outcomes = [
        router.place(PlaceRequest(f"b{i}", SHORT, max_tokens=16, tpot_slo_s=0.0505))
        for i in range(10)
    ]
    assert all(isinstance(o, Placement) and o.decode_worker_id == "d1" for o in outcomes[:5])
    refused = outcomes[5:]
    assert [o.reason for o in refused] == [RejectReason.TPOT_SLO] * 5
    # the best worker's prediction
    assert "71.0ms" not in refused[0].message and "41.0ms" in refused[0].message
    assert refused[0].retry_after_s == pytest.approx(0.041 * 16)
    assert registry.get_sample_value("baton_router_rejections_total", {"reason": "tpot_slo"}) == 5
    # Without a TPOT SLO the decode batch is no bar.
    assert isinstance(router.place(PlaceRequest("c", SHORT, max_tokens=16)), Placement)


@pytest.mark.parametrize("rows, admitted", [(20, {1, 0}), (29, {1})])
def test_lower_priorities_stop_joining_a_decode_batch_sooner(rows, admitted):
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    # 10 + (rows + 1) * 1 ms with one more row
    router.on_stats(decode_stats("d0", clock(), rows=rows))
    # Within 60% (sheddable), 80% (standard) or 90% (critical) of a 50 ms SLO: 30, 40 or 45 ms; each
    # placement adds a row the next request sees.
    outcomes = {
        p: router.place(PlaceRequest(f"p{p}", SHORT, max_tokens=16, tpot_slo_s=0.05, priority=p))
        for p in (1, 0, -1)
    }
    assert {p for p, o in outcomes.items() if isinstance(o, Placement)} == admitted
    assert outcomes[-1].reason is RejectReason.TPOT_SLO and "less 40% headroom" in outcomes[
        -1].message


def test_default_tpot_slo_and_workers_without_a_fit():
    router, clock, _, _ = make_router(default_tpot_slo_s=0.02)
    add(router, clock, "d0")  # no fit reported yet: nothing to refuse on
    assert isinstance(router.place(PlaceRequest("a", SHORT)), Placement)
    router.on_stats(decode_stats("d0", clock(), rows=30))
    assert router.place(PlaceRequest("b", SHORT)).reason is RejectReason.TPOT_SLO


def test_ttft_prediction_counts_the_decode_join_wait():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    plain = router.place(PlaceRequest("a", SHORT)).predicted_ttft_s  # 64 / 10,000 tokens/s
    assert plain == pytest.approx(0.0064)
    router.on_stats(decode_stats("d0", clock() + 1, rows=40, waiting=2))  # 10 + 41 = 51 ms a step
    joined = router.place(PlaceRequest("b", PROMPT[100:164])).predicted_ttft_s  # not cached by "a"
    # the step in progress and two waiting ahead
    assert joined == pytest.approx(0.0064 + 0.051 * 3, rel=0.02)


@pytest.mark.parametrize("at_prefill, join_steps", [(False, 3), (True, 0)])
def test_remote_prefill_whose_first_token_streams_at_once_skips_the_join_wait(
        at_prefill, join_steps):
    router, clock, _, _ = make_router(max_local_prefill_tokens=0)
    add(router, clock, "p0", role=Role.PREFILL)
    add(router, clock, "d0")
    router.on_stats(decode_stats("d0", clock() + 1, rows=40, waiting=2))  # 51 ms a step
    placed = router.place(PlaceRequest("a", SHORT, first_token_at_prefill=at_prefill))
    assert placed.prefill_worker_id == "p0"
    assert placed.predicted_ttft_s == pytest.approx(0.0064 + 0.051 * join_steps, rel=0.02)


def test_queued_deadline_keeps_the_admission_headroom():
    router, clock, outcomes, _ = make_router(saturation_queued_prefill_tokens=4096)
    add(router, clock, "d0", queued=5000)
    # 1 s SLO with the default 20% headroom: it must leave the queue by 0.8 s, not 1 s.
    assert isinstance(router.place(PlaceRequest("r", SHORT, ttft_slo_s=2.0)), Queued)
    clock.advance(1.55)
    router.tick()
    assert outcomes == []
    clock.advance(0.1)  # 1.65 s: past 0.8 x 2 s
    router.tick()
    assert [(o.request_id, o.reason) for o in outcomes] == [("r", RejectReason.DEADLINE)]


def test_queued_request_refused_at_once_when_the_decode_pool_cannot_meet_its_tpot():
    router, clock, outcomes, _ = make_router(saturation_queued_prefill_tokens=4096)
    add(router, clock, "d0", queued=5000)
    assert isinstance(router.place(PlaceRequest("r", SHORT, ttft_slo_s=5.0, tpot_slo_s=0.05)),
                      Queued)
    clock.advance(0.1)
    router.on_stats(decode_stats("d0", clock(), rows=100))  # room for prompts, but 111 ms a step
    assert [(o.request_id, o.reason) for o in outcomes] == [("r", RejectReason.TPOT_SLO)]


def test_place_request_carries_the_tpot_slo_from_the_proto():
    from baton.services.common.wire.router import place_request_from_proto
    from baton.v1 import router_pb2

    message = router_pb2.PlaceRequest(request_id="r", prompt_token_ids=[1, 2, 3], ttft_slo_ms=2000,
                                      tpot_slo_ms=80)
    assert place_request_from_proto(message).tpot_slo_s == pytest.approx(0.08)
    assert place_request_from_proto(router_pb2.PlaceRequest(request_id="r",
                                                            prompt_token_ids=[1
                                                                              ])).tpot_slo_s is None

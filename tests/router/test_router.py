from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.router import DisaggReason, Placement, PlaceRequest
from baton.services.common.roles import Role
from baton.services.common.wire.router import (kv_events_from_proto, kv_snapshot_from_proto,
                                               load_report_from_proto)
from baton.services.router.config import RouterConfig
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.router import Queued, Router
from baton.v1 import worker_pb2

from .helpers import Clock, report, stats

PROMPT = list(range(1, 2049))  # 128 blocks of 16


def make_router(clock: Clock | None = None,
                **overrides) -> tuple[Router, Clock, list, CollectorRegistry]:
    clock, outcomes, registry = clock or Clock(), [], CollectorRegistry()
    settings = dict(model="m", block_size=16, initial_prefill_tokens_per_s=10_000.0,
                    ttft_overhead_s=0.0)
    settings.update(overrides)
    router = Router(RouterConfig(**settings), registry, clock, outcomes.append)
    return router, clock, outcomes, registry


def add(router: Router, clock: Clock, worker_id: str, role: Role = Role.DECODE, **load) -> None:
    router.register_worker(worker_id, f"{worker_id}:1", role, model="m", block_size=16)
    router.on_stats(report(worker_id, clock(), role=int(role), **load))


def stored(router: Router, worker_id: str, tokens: list[int], salt: str | None = None) -> None:
    event = worker_pb2.KVEvent(sequence=1, kind=worker_pb2.KVEvent.KIND_STORED,
                               block_hashes=block_hashes(tokens, 16, "m", salt))
    assert router.on_kv_events(
        kv_events_from_proto(worker_pb2.KVEventBatch(worker_id=worker_id, events=[event])))


def test_placement_follows_the_cache_and_releases_its_reservation():
    router, clock, _, registry = make_router()
    for w in ("d0", "d1", "d2"):
        add(router, clock, w)
    stored(router, "d1", PROMPT[:1024], salt="acme")
    placement = router.place(PlaceRequest("r1", PROMPT, tenant="acme", cache_salt="acme"))
    assert isinstance(placement, Placement)
    assert (placement.decode_worker_id, placement.reason,
            placement.cached_tokens) == ("d1", "prefix_affinity", 1024)
    assert (placement.prefill_worker_id is None and
            placement.disagg_reason is DisaggReason.NO_PREFILL_WORKER)
    assert placement.predicted_ttft_s == pytest.approx(1024 / 10_000)
    # Another tenant's salt gives other hashes: its identical prompt finds no cache anywhere.
    other = router.place(PlaceRequest("r2", PROMPT, tenant="zeta", cache_salt="zeta"))
    assert other.cached_tokens == 0 and other.reason == "load" and other.decode_worker_id != "d1"
    assert router.stats().pools[Role.DECODE].queued_prefill_tokens == 1024 + 2048
    router.release(placement.lease_id, observed_ttft_s=0.2, output_tokens=10)
    router.release(other.lease_id)
    assert router.stats().pools[
        Role.DECODE].queued_prefill_tokens == 0 and router.stats().leases == 0
    with pytest.raises(KeyError):
        router.release(placement.lease_id)
    assert registry.get_sample_value("baton_router_predicted_cached_tokens_total") == 1024
    assert registry.get_sample_value("baton_router_prompt_tokens_total") == 4096


def test_remote_prefill_for_long_uncached_prompts_local_for_short():
    router, clock, _, _ = make_router(max_local_prefill_tokens=512)
    add(router, clock, "p0", Role.PREFILL)
    add(router, clock, "d0")
    remote = router.place(PlaceRequest("long", PROMPT))
    assert (remote.prefill_worker_id, remote.decode_worker_id) == ("p0", "d0")
    assert remote.disagg_reason is DisaggReason.LONG_PREFILL
    short = router.place(PlaceRequest("short", PROMPT[:256]))
    assert short.prefill_worker_id is None and short.disagg_reason is DisaggReason.SHORT_PREFILL
    # The hand-off put the prompt's blocks on d0 too (approximately: no events from it yet), so the
    # same prompt again is a cache hit there and prefills locally.
    again = router.place(PlaceRequest("again", PROMPT))
    assert again.prefill_worker_id is None and again.cached_tokens == 2048


def test_invalid_requests_raise_value_error():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    for bad in [
            PlaceRequest("", PROMPT),
            PlaceRequest("r", []),
            PlaceRequest("r", [1, -2]),
            PlaceRequest("r", PROMPT, ttft_slo_s=0.0),
            PlaceRequest("r", PROMPT, max_tokens=-1)
    ]:
        with pytest.raises(ValueError):
            router.place(bad)
    with pytest.raises(ValueError):
        router.register_worker("x", "x:1", Role.DECODE, model="other")
    with pytest.raises(ValueError):
        router.register_worker("x", "x:1", Role.DECODE, block_size=32)


def test_no_workers_and_expired_registration():
    router, clock, _, registry = make_router(worker_lease_ttl_s=5.0)
    assert router.place(PlaceRequest("r", PROMPT)).reason is RejectReason.NO_WORKERS
    add(router, clock, "d0")
    clock.advance(4.0)
    router.heartbeat("d0")
    router.on_stats(report("d0", clock()))
    clock.advance(4.0)
    router.on_stats(report("d0", clock()))  # stats still flow, but heartbeats stopped
    assert isinstance(router.place(PlaceRequest("r", PROMPT)), Placement)
    clock.advance(1.5)  # 5.5 s since the last heartbeat
    refusal = router.place(PlaceRequest("r", PROMPT))
    assert refusal.reason is RejectReason.NO_WORKERS and refusal.reason.grpc_status == "UNAVAILABLE"
    router.tick()
    with pytest.raises(KeyError):
        router.heartbeat("d0")  # dropped: it must register again
    assert registry.get_sample_value("baton_router_rejections_total", {"reason": "no_workers"}) == 2


def test_draining_worker_gets_nothing_new():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    add(router, clock, "d1")
    stored(router, "d0", PROMPT)
    assert router.drain(["d0", "ghost"]) == ["ghost"]
    assert {router.place(PlaceRequest(f"r{i}", PROMPT)).decode_worker_id
            for i in range(20)} == {"d1"}


def test_a_migrating_request_never_goes_back_to_the_worker_it_broke_on():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    add(router, clock, "d1")
    stored(router, "d0", PROMPT)  # the warm worker, which the cache would pick
    first = router.place(PlaceRequest("r", PROMPT))
    assert first.decode_worker_id == "d0"
    router.release(first.lease_id, failed_worker_id="d0")  # one failure: its circuit stays closed
    moved = router.place(PlaceRequest("r", PROMPT, excluded_worker_ids=frozenset({"d0"})))
    assert moved.decode_worker_id == "d1"
    router.release(moved.lease_id, failed_worker_id="d1")
    gone = router.place(PlaceRequest("r", PROMPT, excluded_worker_ids=frozenset({"d0", "d1"})))
    assert isinstance(gone, Rejection) and gone.reason is RejectReason.NO_WORKERS


def test_failing_worker_is_circuit_broken_then_probed():
    router, clock, _, _ = make_router(circuit_failure_threshold=2, circuit_cooldown_s=5.0)
    add(router, clock, "d0")
    add(router, clock, "d1")
    stored(router, "d0", PROMPT)
    for i in range(2):
        p = router.place(PlaceRequest(f"r{i}", PROMPT))
        assert p.decode_worker_id == "d0"
        router.release(p.lease_id, failed_worker_id="d0")
    assert router.place(PlaceRequest("r2", PROMPT[::-1])).decode_worker_id == "d1"
    clock.advance(5.0)
    for w in ("d0", "d1"):
        router.on_stats(report(w, clock()))
    probe = router.place(PlaceRequest("probe", PROMPT))
    assert probe.decode_worker_id == "d0"  # half-open: one request goes back to the warm worker
    # the rest wait for its verdict
    assert router.place(PlaceRequest("next", PROMPT)).decode_worker_id == "d1"
    router.release(probe.lease_id, observed_ttft_s=0.3)
    assert router.place(PlaceRequest("after", PROMPT)).decode_worker_id == "d0"


def test_ttft_slo_refusal_at_the_router():
    router, clock, _, registry = make_router()
    add(router, clock, "d0", queued=8000)
    # (8000 + 2048) / 10000 = 1.005 s
    refusal = router.place(PlaceRequest("r", PROMPT, ttft_slo_s=0.5))
    assert isinstance(refusal, Rejection) and refusal.reason is RejectReason.TTFT_SLO
    assert refusal.retry_after_s == pytest.approx(1.0048 - 0.5 * 0.8)  # the default 20% headroom
    # 1.1 s would fit the prediction but not the headroom; 1.3 s fits both.
    assert router.place(PlaceRequest("r", PROMPT, ttft_slo_s=1.1)).reason is RejectReason.TTFT_SLO
    assert isinstance(router.place(PlaceRequest("r", PROMPT, ttft_slo_s=1.3)), Placement)
    assert registry.get_sample_value("baton_router_rejections_total", {"reason": "ttft_slo"}) == 2


def test_saturated_workers_queue_then_serve_by_priority():
    router, clock, outcomes, registry = make_router(saturation_queued_prefill_tokens=4096)
    add(router, clock, "d0", queued=5000)
    shed = router.place(PlaceRequest("shed", PROMPT, priority=-1))
    assert shed.reason is RejectReason.SHED and shed.retry_after_s is not None
    assert isinstance(router.place(PlaceRequest("normal", PROMPT)), Queued)
    assert isinstance(router.place(PlaceRequest("urgent", PROMPT, priority=3)), Queued)
    assert outcomes == []
    clock.advance(0.2)
    router.on_stats(report("d0", clock(), queued=0))  # room again: the urgent request goes first
    served = [(o.request_id, type(o).__name__) for o in outcomes]
    assert served[0] == ("urgent", "Placement")
    assert registry.get_sample_value("baton_router_queue_time_seconds_count",
                                     {"priority": "critical"}) == 1


def test_queued_request_times_out_and_is_told_so():
    router, clock, outcomes, _ = make_router(saturation_queued_prefill_tokens=4096,
                                             queue_max_age_s=2.0)
    add(router, clock, "d0", queued=5000)
    assert isinstance(router.place(PlaceRequest("r", PROMPT)), Queued)
    clock.advance(2.5)
    router.tick()
    assert [(o.request_id, o.reason) for o in outcomes] == [("r", RejectReason.QUEUE_TIMEOUT)]


def test_full_queue_refuses_with_a_hint():
    router, clock, _, _ = make_router(saturation_queued_prefill_tokens=4096, queue_max_size=1)
    add(router, clock, "d0", queued=5000)
    assert isinstance(router.place(PlaceRequest("a", PROMPT)), Queued)
    full = router.place(PlaceRequest("b", PROMPT))
    assert full.reason is RejectReason.QUEUE_FULL and full.retry_after_s > 0


def test_lease_of_a_vanished_gateway_expires():
    router, clock, _, _ = make_router(placement_lease_ttl_s=30.0)
    add(router, clock, "d0")
    lease = router.place(PlaceRequest("r", PROMPT)).lease_id
    clock.advance(29.0)
    router.tick()
    assert router.stats().leases == 1
    clock.advance(1.0)
    router.tick()
    assert router.stats().leases == 0 and router.stats().pools[
        Role.DECODE].queued_prefill_tokens == 0
    with pytest.raises(KeyError):
        router.release(lease)


def test_gap_in_events_asks_for_a_snapshot():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    batch = worker_pb2.KVEventBatch(worker_id="d0", gap=True)
    assert not router.on_kv_events(kv_events_from_proto(batch))
    router.on_kv_snapshot(kv_snapshot_from_proto(
        worker_pb2.KVSnapshot(worker_id="d0", sequence=7,
                              block_hashes=block_hashes(PROMPT, 16, "m"))))
    assert router.place(PlaceRequest("r", PROMPT)).cached_tokens == 2048


def test_plugin_reload_changes_decisions():
    router, clock, _, _ = make_router()
    add(router, clock, "d0")
    add(router, clock, "d1")
    stored(router, "d0", PROMPT)
    assert router.place(PlaceRequest("a", PROMPT)).reason == "prefix_affinity"
    router.apply_plugin_settings(
        router.plugin_settings.model_copy(update={"sticky_queued_prefill_tokens": 0}))
    assert router.place(PlaceRequest("b", PROMPT)).reason == "load"


def test_worker_load_is_exported():
    router, clock, _, registry = make_router()
    add(router, clock, "d0", queued=300)
    clock.advance(1.5)
    assert registry.get_sample_value("baton_router_worker_queued_prefill_tokens",
                                     {"worker": "d0"}) == 300
    assert registry.get_sample_value("baton_router_worker_stats_age_seconds",
                                     {"worker": "d0"}) == 1.5



def test_reported_ttft_teaches_the_predictor_and_is_exported():
    router, clock, _, registry = make_router()
    add(router, clock, "d0")
    first = router.place(PlaceRequest("r1", PROMPT))
    assert first.predicted_ttft_s == pytest.approx(2048 / 10_000)
    router.release(first.lease_id, observed_ttft_s=2048 / 5_000)  # the worker is half as fast
    failed = router.place(PlaceRequest("r2", PROMPT[::-1]))
    router.release(failed.lease_id, observed_ttft_s=9.0, failed_worker_id="d0")  # not a rate sample
    # EWMA (alpha 0.2) from 10k tok/s towards the 5k the release showed.
    fresh = list(range(5000, 6024))
    assert router.place(PlaceRequest("r3", fresh)).predicted_ttft_s == pytest.approx(1024 / 9_000)
    count = {"worker": "d0"}
    assert registry.get_sample_value("baton_router_observed_ttft_seconds_count", count) == 1
    total = registry.get_sample_value("baton_router_observed_ttft_seconds_sum", count)
    assert total == pytest.approx(0.4096)
    router.remove_worker("d0")
    assert registry.get_sample_value("baton_router_observed_ttft_seconds_count", count) is None


HERD_SETTINGS: dict = {}


def test_two_replicas_do_not_herd_a_shared_prefix_burst():
    """Issue 4, done-when 4, at the core's level: two routers, one hot prefix, loaded workers, 200
    requests."""
    workers = [f"d{i}" for i in range(8)]
    clock = Clock()
    # One shared clock, as if both ran on synchronised hosts.
    replicas = [make_router(clock, seed=seed, **HERD_SETTINGS)[0] for seed in (1, 2)]
    for router in replicas:
        for w in workers:
            router.register_worker(w, f"{w}:1", Role.DECODE)
        stored(router, "d0", PROMPT)
    placed = dict.fromkeys(workers, 0)
    queued = dict.fromkeys(workers, 3000)  # every worker already busy
    for i in range(200):
        # workers report every 20 requests: in between each replica counts only its own work
        if i % 20 == 0:
            clock.advance(0.01)
            for router in replicas:
                for w in workers:
                    router.on_stats(report(w, clock(), queued=queued[w], running=20 + placed[w],
                                           kv_used=16 * (20 + placed[w]), kv_total=2000))
            clock.advance(0.01)
        # 16 blocks of output each
        p = replicas[i % 2].place(PlaceRequest(f"r{i}", PROMPT, max_tokens=256))
        placed[p.decode_worker_id] += 1
        queued[p.decode_worker_id] += 2048 - p.cached_tokens
    load = [20 + placed[w] for w in workers]  # requests on each worker
    assert max(load) <= 1.5 * sum(load) / len(load), placed


def test_concurrent_placements_keep_the_books_straight():
    router, clock, _, _ = make_router()
    for w in ("d0", "d1", "d2", "d3"):
        add(router, clock, w)
    leases: list[str] = []

    def client(k: int) -> None:
        for i in range(100):
            p = router.place(PlaceRequest(f"{k}-{i}", PROMPT[: 16 * (1 + i % 8)]))
            leases.append(p.lease_id)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(leases)) == 400 and router.stats().leases == 400
    for lease in leases:
        router.release(lease)
    assert router.stats().leases == 0 and router.stats().pools[Role.DECODE].inflight_requests == 0


def test_stats_carry_the_smallest_limit_the_live_workers_report():
    """The gateway's context limit comes from here: a request must fit whichever worker it lands
    on, and a worker whose registration lapsed no longer counts."""
    router, clock, _, _ = make_router()
    for worker_id, lease_s in (("d0", float("inf")), ("d1", 5.0)):
        router.register_worker(worker_id, f"{worker_id}:1", Role.DECODE, model="m", block_size=16,
                               lease_ttl_s=lease_s)
    assert (router.stats().model, router.stats().max_model_len) == ("m", 0)
    for worker_id, limit in (("d0", 4096), ("d1", 256)):
        message = stats(worker_id, clock())
        message.max_model_len = limit
        router.on_stats(load_report_from_proto(message))
    assert router.stats().max_model_len == 256
    clock.advance(6.0)  # d1's registration has run out; d0 is a static worker
    assert router.stats().max_model_len == 4096

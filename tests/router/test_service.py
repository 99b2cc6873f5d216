"""The router as a service: a `baton router` process over simulated workers (`baton worker --engine
sim`), all real processes on loopback. One module-wide cluster keeps the folder fast: three workers,
a router that finds them from a static list (and reloads a plugin file), and a router they register
with."""
from __future__ import annotations

import random
import time

import grpc
import pytest

from baton.v1 import router_pb2 as rpb

from tests.launcher import launch_router, launch_sim_worker, stop_all, wait_for

from .grpc_clients import RouterClient, generate_on, worker_id_of

SCORERS = "scorers:\n- {name: prefix_overlap, weight: %s}\n- {name: kv_utilization, weight: 1}\n"
CONFIG_ON = SCORERS % 2.0
CONFIG_NO_AFFINITY = SCORERS % 0.0 + "sticky_queued_prefill_tokens: 0\n"


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 500) for _ in range(length)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config_file = tmp_path_factory.mktemp("router") / "plugins.yaml"
    config_file.write_text(CONFIG_ON)
    launched = [launch_sim_worker(f"sim-{i}") for i in range(3)]
    workers, addresses = [w for w, _ in launched], [a for _, a in launched]
    # Everything starts side by side: the static router keeps polling its workers until they answer.
    # A stats age bound far above the breaker's reaction time makes a killed worker's exclusion the
    # breaker's doing.
    static, _ = launch_router("router-static", "--workers", ",".join(addresses), "--config-file",
                              str(config_file), "--config-poll-interval-s", "0.1",
                              "--stats-max-age-s", "5")
    registry, _ = launch_router("router-registry", "--worker-lease-ttl-s", "1.5")
    services = [static, registry, *workers]
    for service in services:
        service.wait_ready()
    ids = [worker_id_of(a) for a in addresses]
    yield dict(workers=workers, addresses=addresses, ids=ids, static=RouterClient(static.address),
               registry=RouterClient(registry.address), config_file=config_file)
    codes = stop_all(services)
    assert codes[:2] == [0, 0], static.log() + registry.log()


def test_stats_polling_reaches_the_router(cluster):
    router = cluster["static"]
    # mean KV utilization counts a worker without stats as full (1.0): below 1 means every worker's
    # stats arrived. A worker that came up late is reached at the router's next reconnect (at most
    # 5 s apart), which a loaded machine may stretch.
    wait_for(lambda: router.pool().workers == 3 and router.pool().mean_kv_utilization < 1.0,
             timeout=20, what="stats for all")
    assert router.pool().saturated_workers == 0


def test_placement_follows_the_prefix_cache_from_kv_events(cluster):
    router, target = cluster["static"], cluster["ids"][1]
    warm = prompt(1, 320)
    # Computed on the worker directly: only its KV events can tell the router where these blocks
    # are.
    generate_on(cluster["addresses"][1], "warm-1", warm)

    def placed_warm() -> bool:
        placement = router.place(f"follow-{random.random()}", warm + prompt(2, 40), max_tokens=4)
        router.release(placement.lease_id)
        return (placement.decode_worker_id == target and placement.predicted_cached_tokens >= 304
                and placement.reason == rpb.PLACEMENT_REASON_PREFIX_AFFINITY)

    wait_for(placed_warm, what="placement on the cache-warm worker")
    # A cold prompt has no affinity.
    cold = router.place("cold-1", prompt(3, 320))
    router.release(cold.lease_id)
    assert cold.predicted_cached_tokens == 0 and cold.reason == rpb.PLACEMENT_REASON_LOAD


def test_refusals_and_bad_input_map_to_status_codes(cluster):
    router = cluster["static"]
    with pytest.raises(grpc.RpcError) as refused:
        router.place("slo-1", prompt(4, 1500), ttft_slo_ms=1)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(refused.value.trailing_metadata())
    assert trailers["rejection-reason"] == "ttft_slo" and int(trailers["retry-after-ms"]) > 0
    detail = rpb.Rejection.FromString(trailers["baton-rejection-bin"])
    assert detail.reason == "ttft_slo" and detail.request_id == "slo-1"
    assert "ttft_slo" in refused.value.details() and "retry after" in refused.value.details()
    with pytest.raises(grpc.RpcError) as bad:
        router.place("", [1, 2, 3])
    assert bad.value.code(
    ) == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in bad.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        router.release("no-such-lease")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    # Still serving after all of it.
    router.release(router.place("after-1", prompt(5, 64)).lease_id)


def test_registration_lease_drain_and_no_workers(cluster):
    router, ids, addresses = cluster["registry"], cluster["ids"], cluster["addresses"]
    with pytest.raises(grpc.RpcError) as none:
        router.place("none-1", prompt(6, 64))
    assert none.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as wrong_model:
        router.stub.RegisterWorker(
            rpb.RegisterWorkerRequest(worker_id="x", address="127.0.0.1:1",
                                      role=rpb.WORKER_ROLE_MIXED, model="other"))
    assert wrong_model.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for worker_id, address in zip(ids[:2], addresses[:2]):
        answer = router.stub.RegisterWorker(
            rpb.RegisterWorkerRequest(worker_id=worker_id, address=address,
                                      role=rpb.WORKER_ROLE_MIXED, model="tiny-llama",
                                      block_size=16))
        assert answer.lease_ttl_ms == 1500
    wait_for(lambda: router.pool().mean_kv_utilization < 1.0, what="stats of registered workers")
    assert router.stub.Drain(
        rpb.DrainRequest(worker_ids=[ids[1], "ghost"])).unknown_worker_ids == ["ghost"]
    placements = [router.place(f"drain-{i}", prompt(100 + i, 64)) for i in range(10)]
    assert {p.decode_worker_id for p in placements} == {ids[0]}
    for p in placements:
        router.release(p.lease_id)
    # Only the first keeps heartbeating: the second leaves the candidate set once its lease runs
    # out.
    def heartbeat_and_count() -> bool:
        router.stub.Heartbeat(rpb.HeartbeatRequest(worker_id=ids[0]))
        return router.pool().workers == 1

    wait_for(heartbeat_and_count, timeout=5.0, what="expiry of the silent worker's lease")
    # a few 0.1 s housekeeping ticks: the expired worker is then forgotten, not just filtered
    time.sleep(0.3)
    with pytest.raises(grpc.RpcError) as gone:
        router.stub.Heartbeat(rpb.HeartbeatRequest(worker_id=ids[1]))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_config_reload_changes_weights_without_restart(cluster):
    router, config_file, target = cluster["static"], cluster["config_file"], cluster["ids"][0]
    warm = prompt(7, 320)
    generate_on(cluster["addresses"][0], "warm-2", warm)

    def reason() -> int:
        placement = router.place(f"reload-{random.random()}", warm + prompt(8, 32))
        router.release(placement.lease_id)
        return placement.reason if placement.decode_worker_id == target else -1

    wait_for(lambda: reason() == rpb.PLACEMENT_REASON_PREFIX_AFFINITY,
             what="affinity before the reload")
    config_file.write_text(CONFIG_NO_AFFINITY)
    wait_for(lambda: all(reason() != rpb.PLACEMENT_REASON_PREFIX_AFFINITY for _ in range(3)),
             what="reload")
    config_file.write_text(CONFIG_ON)
    wait_for(lambda: reason() == rpb.PLACEMENT_REASON_PREFIX_AFFINITY,
             what="affinity after restoring")


def test_killed_worker_is_circuit_broken(cluster):
    router, victim = cluster["static"], cluster["workers"][2]
    victim_id = cluster["ids"][2]
    placements = [router.place(f"spread-{i}", prompt(200 + i, 64)) for i in range(12)]
    assert victim_id in {p.decode_worker_id
                         for p in placements}, "the victim took no work before the kill"
    for p in placements:
        router.release(p.lease_id)
    victim.kill()
    # Ten 0.1 s polls fail meanwhile (three open the breaker); the victim's stats only count as
    # stale after 5 s, so staleness cannot be what excludes it.
    time.sleep(1.0)
    batch = [router.place(f"after-kill-{i}", prompt(300 + i, 64)) for i in range(8)]
    for p in batch:
        router.release(p.lease_id)
    assert victim_id not in {p.decode_worker_id for p in batch}
    # a static worker stays known (and probed) until the list changes
    assert router.pool().workers == 3

"""No herding across router replicas: two `baton router` processes over the same simulated workers,
already busy past the sticky threshold, take a burst of 200 requests sharing one cache-warm prefix,
split between them at once. Each replica counts only its own reservations plus the workers' polled
load, so this is where two replicas could both pile onto the warm worker, or onto the same
least-loaded one."""
from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
from baton.services.common.process import ServiceProcess
from baton.v1 import worker_pb2 as wpb
from baton.v1 import worker_pb2_grpc

from tests.launcher import launch_router, launch_sim_worker, stop_all, wait_for

from .grpc_clients import RouterClient, generate_on, worker_id_of

WORKERS = 4
BURST = 200
PREFIX_TOKENS = 256
# Above the routers' default sticky threshold (32 in flight): the warm worker no longer attracts its
# prefix, so the burst is spread by load alone, which is what the replicas must not herd on.
BACKGROUND_PER_WORKER = 40
# Slow decode steps and long outputs: every request stays in flight on its worker for the whole
# test, so the workers' polled stats show the load piling up while both routers keep placing.
SLOW_SIM = ("--sim-step-base-seconds", "0.05", "--num-kv-blocks", "4096")
LONG_OUTPUT = 1500  # with the 288-token prompts, within the model's 2,048-token context


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(10, 500) for _ in range(length)]


def _start(stub: worker_pb2_grpc.WorkerStub, request_id: str, prompt: list[int]) -> grpc.Future:
    """Starts a long request without consuming its stream, so it keeps running until cancelled."""
    return stub.Generate(
        wpb.GenerateRequest(meta=wpb.RequestMeta(request_id=request_id), prompt_token_ids=prompt,
                            params=wpb.SamplingParams(max_tokens=LONG_OUTPUT, temperature=0.0)),
        timeout=60)


def _start_cluster() -> tuple[list[ServiceProcess], list[RouterClient], list[str]]:
    launched = [launch_sim_worker(f"sim-{i}", *SLOW_SIM) for i in range(WORKERS)]
    addresses = [a for _, a in launched]
    routers = [launch_router(f"router-{k}", "--workers", ",".join(addresses))[0] for k in range(2)]
    services = [*routers, *(w for w, _ in launched)]
    for service in services:
        service.wait_ready()
    return services, [RouterClient(r.address) for r in routers], addresses


def _wait_warm_and_busy(clients: list[RouterClient], prefix: list[int], warm_id: str,
                        rng: random.Random) -> None:
    def both_see_the_warm_prefix() -> bool:
        placements = [
            c.place(f"probe-{random.random()}", prefix + _prompt(rng, 16)) for c in clients
        ]
        for c, p in zip(clients, placements):
            c.release(p.lease_id)
        return all(p.decode_worker_id == warm_id and p.predicted_cached_tokens >= PREFIX_TOKENS
                   for p in placements)

    for client in clients:
        # Below 1 means every worker's stats arrived (a worker without stats counts as full).
        wait_for(
            lambda c=client: c.pool().workers == WORKERS and c.pool().mean_kv_utilization < 1.0,
            timeout=15.0, what="stats of every worker")
    wait_for(both_see_the_warm_prefix, timeout=15.0, what="both routers know the warm prefix")


def _burst(clients: list[RouterClient], addresses: list[str],
           rng: random.Random) -> tuple[Counter, int]:
    """Placements per worker for the burst, and how many requests had ended before it was all
    placed."""
    # Channels live for the whole burst: a channel collected while its call streams cancels the
    # call.
    stubs = {a: worker_pb2_grpc.WorkerStub(grpc.insecure_channel(a)) for a in addresses}
    prefix = _prompt(rng, PREFIX_TOKENS)
    generate_on(addresses[0], "warm", prefix + _prompt(rng, 16))
    _wait_warm_and_busy(clients, prefix, worker_id_of(addresses[0]), rng)
    background = [_start(stubs[a], f"bg-{a}-{j}", _prompt(rng, 64))
                  for a in addresses for j in range(BACKGROUND_PER_WORKER)]
    for client in clients:
        wait_for(lambda c=client: c.pool().inflight_requests >= WORKERS * BACKGROUND_PER_WORKER,
                 timeout=15.0, what="the background load in the routers' view")
    prompts = [prefix + _prompt(rng, 32) for _ in range(BURST)]

    def place_and_run(i: int) -> tuple[str, str, grpc.Future]:
        placement = clients[i % 2].place(f"burst-{i}", prompts[i], max_tokens=LONG_OUTPUT)
        return placement.decode_worker_id, placement.lease_id, _start(
            stubs[placement.decode_address], f"burst-{i}", prompts[i])

    with ThreadPoolExecutor(32) as pool:
        placed = list(pool.map(place_and_run, range(BURST)))
    calls = background + [call for _, _, call in placed]
    # an error or an end: that request was no load
    finished_early = sum(call.done() for call in calls)
    for call in calls:
        call.cancel()
    for i, (_, lease_id, _) in enumerate(placed):
        clients[i % 2].release(lease_id)
    return Counter(worker_id for worker_id, _, _ in placed), finished_early


def test_two_replicas_do_not_herd_on_a_shared_prefix():
    services, clients, addresses = _start_cluster()
    try:
        counts, finished_early = _burst(clients, addresses, random.Random(4))
    finally:
        codes = stop_all(services)
    assert codes[:2] == [0, 0], services[0].log() + services[1].log()
    assert finished_early == 0 and sum(counts.values()) == BURST
    mean = BURST / WORKERS
    # Herding piles far more on one worker (test_cold_start_herd.py saw 113 of 200 before its fix);
    # stats polled late on a busy machine give up to 78 without it (load 12-16), so 85 is the bound.
    assert max(counts.values()) <= 1.7 * mean, f"herding: {dict(counts)} (mean {mean})"

"""A worker started with --router registers itself, heartbeats, and receives placements; once it
dies, the router drops it within its lease, and at once when it is stopped with SIGTERM (its stats
stream reports it draining)."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import grpc

from baton.services.common.process import ServiceProcess
from tests.launcher import launch_router, launch_sim_worker, stop_all, wait_for
from tests.router.grpc_clients import RouterClient

PROMPT = list(range(1, 40))


def _outcome(client: RouterClient) -> str | grpc.StatusCode:
    """Where a probe placement lands, or the status the router refused it with."""
    try:
        return client.place("probe", PROMPT, max_tokens=4).decode_address
    except grpc.RpcError as e:
        return e.code()


@contextlib.contextmanager
def registered_worker(lease_ttl_s: float) -> Iterator[tuple[ServiceProcess, RouterClient]]:
    """A router and a simulated worker started with --router, once the router places requests on
    it."""
    router, _ = launch_router("router", "--worker-lease-ttl-s", str(lease_ttl_s))
    router.wait_ready()
    worker, address = launch_sim_worker("worker", "--router", router.address)
    try:
        worker.wait_ready()
        client = RouterClient(router.address)
        wait_for(lambda: _outcome(client) == address, timeout=15,
                 what="a placement on the registered worker")
        yield worker, client
    finally:
        stop_all([worker, router])


def test_worker_registers_itself_and_leaves_with_its_lease():
    with registered_worker(lease_ttl_s=1.5) as (worker, client):
        worker.kill()
        wait_for(lambda: _outcome(client) == grpc.StatusCode.UNAVAILABLE, timeout=10,
                 what="the dead worker dropped")


def test_sigterm_takes_the_worker_out_of_placement_before_its_lease_ends():
    with registered_worker(lease_ttl_s=60) as (worker, client):
        worker.process.send_signal(signal.SIGTERM)
        # Far inside the 60 s lease.
        wait_for(lambda: _outcome(client) == grpc.StatusCode.UNAVAILABLE, timeout=10,
                 what="the draining worker out of placement")
        assert worker.process.wait(timeout=30) == 0

"""A worker killed (-9) and restarted on its address, as `baton serve` restarts it, seen by a
router's feeds (a real simulated worker process; the router and its feeds in this process): once
its event stream breaks the index claims none of its blocks (not even from this router's own
placements), and once it answers again the feed resyncs from its snapshot and follows its new
events."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.router.config import RouterConfig
from baton.services.router.router import Router
from baton.services.router.worker_feeds import FeedSet
from tests.launcher import SIM_MODEL, launch_sim_worker

from .grpc_clients import generate_on

PROMPT = list(range(100, 164))  # four full blocks


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_restarted_worker_is_forgotten_then_resynced():
    worker, address = launch_sim_worker("sim-restarted")
    await asyncio.to_thread(worker.wait_ready)
    config = RouterConfig(model=SIM_MODEL)
    router = Router(config)
    feeds = FeedSet(router, poll_interval_s=0.1, rpc_timeout_s=2.0)
    feeds.set_discovered({address: False})
    hashes = block_hashes(PROMPT, config.block_size, SIM_MODEL)

    def held() -> int:
        return router.index.match_lengths(hashes).get(feeds.feeds[address].worker_id or "", 0)

    try:
        await asyncio.to_thread(generate_on, address, "warm", PROMPT)
        await until(lambda: held() == 4, 20, "the prompt's blocks in the index")
        # Placed through this router too: its journal would answer for the worker without events.
        placed = router.place(PlaceRequest("again", PROMPT))
        assert isinstance(placed, Placement) and placed.cached_tokens == 64
        router.release(placed.lease_id)

        worker.kill()
        await until(lambda: held() == 0, 10, "the dead worker's blocks forgotten")
        await asyncio.sleep(0.5)
        assert held() == 0  # the journal of placements does not bring them back

        worker.relaunch()
        await asyncio.to_thread(worker.wait_ready)
        await asyncio.to_thread(generate_on, address, "warm-again", PROMPT)
        await until(lambda: held() == 4, 10, "its new blocks in the index")
    finally:
        await feeds.close()
        worker.terminate()

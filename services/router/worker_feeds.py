"""Per worker, the two feeds the router decides from: its load (GetStats, polled) and its prefix
cache (a KV snapshot, then StreamKVEvents, resynced from a fresh snapshot on a gap).

A feed either knows its worker's id (the worker registered itself) or learns it from the first stats
answer (the worker came from a static list or from EndpointSlices); such a discovered worker is
registered here with a lease that never runs out, since the discovery source, not a heartbeat, says
when it leaves.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import replace

import grpc

from baton.services.common.messages.worker import LoadReport
from baton.services.common.wire.router import (kv_events_from_proto, kv_snapshot_from_proto,
                                               load_report_from_proto)
from baton.services.common.worker_stubs import (RECONNECT_MAX_S, RECONNECT_MIN_S,
                                                RECONNECT_OPTIONS)
from baton.services.router.router import Router
from baton.services.router.runtime_loras import RETRY_FAILED_S, LoRALoad
from baton.v1 import worker_pb2 as wpb
from baton.v1 import worker_pb2_grpc

log = logging.getLogger(__name__)
# Reading a large adapter from a slow volume takes a while (the gateway's own load waits as long).
LORA_LOAD_TIMEOUT_S = 300.0


class WorkerFeed:
    def __init__(self, router: Router, address: str, poll_interval_s: float, rpc_timeout_s: float,
                 worker_id: str | None = None) -> None:
        self.router = router
        self.address = address
        self.poll_interval_s = poll_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.discovered = worker_id is None
        self.worker_id = worker_id
        self._identified = asyncio.Event()
        if worker_id is not None:
            self._identified.set()
        self._channel = grpc.aio.insecure_channel(address, options=RECONNECT_OPTIONS)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._failing = False
        self._events_lost = False
        self._answering = asyncio.Event()  # set when stats answer again after failing
        self._loading_loras: asyncio.Future | None = None
        self._tasks = [
            asyncio.ensure_future(self._poll_stats()),
            asyncio.ensure_future(self._follow_events())
        ]

    async def close(self) -> None:
        if self._loading_loras is not None:
            self._tasks.append(self._loading_loras)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close()

    # -- load --------------------------------------------------------------------------------------

    async def _poll_stats(self) -> None:
        while True:
            try:
                stats = await self._stub.GetStats(wpb.GetStatsRequest(), timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as e:
                self._on_poll_failure(e)
            else:
                self._on_stats(load_report_from_proto(stats))
            await asyncio.sleep(self.poll_interval_s)

    def _on_poll_failure(self, error: grpc.aio.AioRpcError) -> None:
        # Every failed poll counts toward the breaker (a dead worker opens it within a few polls,
        # and a half-open probe reopens it), but the log says so once per outage.
        if not self._failing:
            log.warning("worker %s at %s: stats poll failed: %s %s", self.worker_id or
                        "(unidentified)", self.address,
                        error.code().name, error.details())
            self._failing = True
        if self.worker_id is not None:
            self.router.report_failure(self.worker_id)

    def _on_stats(self, report: LoadReport) -> None:
        if self._failing:
            log.info("worker %s at %s answers again", self.worker_id or report.worker_id,
                     self.address)
            self._failing = False
            self._answering.set()
        if self.discovered and not self._register(report):
            return
        # A registration names the worker; its stats must land under that name whatever the worker
        # calls itself.
        report = replace(report, worker_id=self.worker_id)
        if not self.router.on_stats(report) and self.discovered:
            # the router dropped it (a lease ran out); a discovered worker comes back
            self._register(report)
            self.router.on_stats(report)
        self._sync_loras()

    # -- runtime LoRA adapters ---------------------------------------------------------------------

    def _sync_loras(self) -> None:
        """Loads the runtime adapters the worker lacks (services/router/runtime_loras.py), one
        batch at a time."""
        if self._loading_loras is not None and not self._loading_loras.done():
            return
        loads = self.router.runtime_loras.to_load(self.worker_id)
        if loads:
            self._loading_loras = asyncio.ensure_future(self._load_loras(loads))

    async def _load_loras(self, loads: list[LoRALoad]) -> None:
        for load in loads:
            request = wpb.LoadLoRAAdapterRequest(lora_name=load.name, lora_path=load.path)
            try:
                await self._stub.LoadLoRAAdapter(request, timeout=LORA_LOAD_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                # a worker that already serves it (the gateway's own fan-out got there first) has it
                ok = e.code() == grpc.StatusCode.ALREADY_EXISTS
                if not ok:
                    log.warning("worker %s: runtime LoRA adapter %s not loaded (retried in %.0fs): "
                                "%s: %s", self.worker_id, load.name, RETRY_FAILED_S,
                                e.code().name, e.details())
            else:
                ok = True
                log.info("worker %s: runtime LoRA adapter %s loaded from %s", self.worker_id,
                         load.name, load.path)
            self.router.runtime_loras.loaded(self.worker_id, load, ok)

    def _register(self, report: LoadReport) -> bool:
        worker_id = report.worker_id or self.address
        try:
            if report.role is None:
                raise ValueError("it reports no role this router knows")
            self.router.register_worker(worker_id, self.address, report.role, model=report.model,
                                        block_size=report.block_size, lease_ttl_s=float("inf"))
        except ValueError as e:
            if not self._failing:
                log.error("worker at %s not added: %s", self.address, e)
                self._failing = True
            return False
        if self.worker_id is None:
            log.info("worker %s (%s) discovered at %s", worker_id, report.role.label, self.address)
        self.worker_id = worker_id
        self._identified.set()
        return True

    # -- prefix cache ------------------------------------------------------------------------------

    async def _follow_events(self) -> None:
        await self._identified.wait()
        backoff = RECONNECT_MIN_S
        while True:
            try:
                await self._sync_and_stream()
                backoff = RECONNECT_MIN_S  # a resync request, not a failure: go again at once
            except grpc.aio.AioRpcError as e:
                self._answering.clear()
                # Without events the index falls back to this router's own placements for the
                # worker; an unreachable worker's cache is forgotten (it may have died with it).
                self.router.set_events_available(self.worker_id, False)
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    self.router.forget_cached_blocks(self.worker_id)
                if not self._events_lost:
                    log.warning(
                        "worker %s: KV event stream lost (%s); prefix index approximate "
                        "until it is back",
                        self.worker_id,
                        e.code().name)
                    self._events_lost = True
                await self._retry_after(backoff)
                backoff = min(RECONNECT_MAX_S, backoff * 2)

    async def _retry_after(self, backoff_s: float) -> None:
        """Waits out the back-off, or less: a worker that answers its stats poll again (restarted on
        its address, say) is resynced at once."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._answering.wait(), backoff_s)

    async def _sync_and_stream(self) -> None:
        """A snapshot first, then events after it; returns when the index asks for a resync."""
        snapshot = await self._stub.GetKVSnapshot(wpb.GetKVSnapshotRequest(),
                                                  timeout=self.rpc_timeout_s)
        # under the name the worker registered with, whatever it calls itself
        self.router.on_kv_snapshot(
            replace(kv_snapshot_from_proto(snapshot), worker_id=self.worker_id))
        if self._events_lost:
            log.info("worker %s: KV events resynced from a snapshot of %d blocks", self.worker_id,
                     len(snapshot.block_hashes))
            self._events_lost = False
        stream = self._stub.StreamKVEvents(
            wpb.StreamKVEventsRequest(after_sequence=snapshot.sequence))
        try:
            async for batch in stream:
                events = replace(kv_events_from_proto(batch), worker_id=self.worker_id)
                if not self.router.on_kv_events(events):
                    log.info("worker %s: KV events have a gap; resyncing from a snapshot",
                             self.worker_id)
                    return
        finally:
            stream.cancel()


class FeedSet:
    """The feeds of every worker the router knows, kept in step with registrations and with
    discovery."""

    def __init__(self, router: Router, poll_interval_s: float, rpc_timeout_s: float) -> None:
        self.router = router
        self.poll_interval_s = poll_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.feeds: dict[str, WorkerFeed] = {}  # by address
        self._discovered: set[str] = set()

    def ensure_registered(self, worker_id: str, address: str) -> None:
        feed = self.feeds.get(address)
        if feed is not None and feed.worker_id == worker_id:
            return
        if feed is not None:
            self._stop(address)
        self.feeds[address] = WorkerFeed(self.router, address, self.poll_interval_s,
                                         self.rpc_timeout_s, worker_id)

    def set_discovered(self, addresses: dict[str, bool]) -> None:
        """The discovery source's current view: address -> draining (a terminating endpoint)."""
        for address in self._discovered - addresses.keys():
            feed = self.feeds.get(address)
            if feed is not None and feed.worker_id is not None:
                log.info("worker %s at %s left discovery", feed.worker_id, address)
                self.router.remove_worker(feed.worker_id)
            self._stop(address)
        for address, draining in addresses.items():
            if address not in self.feeds:
                self.feeds[address] = WorkerFeed(self.router, address, self.poll_interval_s,
                                                 self.rpc_timeout_s)
            feed = self.feeds[address]
            if draining and feed.worker_id is not None:
                self.router.drain([feed.worker_id])
        self._discovered = set(addresses)

    def reconcile(self, members: Iterable[str]) -> None:
        """Stops the feeds of registered workers the router dropped (their heartbeat lease ran
        out)."""
        alive = set(members)
        for address, feed in list(self.feeds.items()):
            if not feed.discovered and feed.worker_id not in alive:
                log.info("worker %s at %s stopped heartbeating; feed stopped", feed.worker_id,
                         address)
                self._stop(address)

    def _stop(self, address: str) -> None:
        feed = self.feeds.pop(address, None)
        if feed is not None:
            asyncio.ensure_future(feed.close())

    async def close(self) -> None:
        feeds, self.feeds = list(self.feeds.values()), {}
        await asyncio.gather(*(feed.close() for feed in feeds), return_exceptions=True)

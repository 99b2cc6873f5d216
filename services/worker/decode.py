"""The decode side: serve a request's tokens, after pulling its prompt's KV from a prefill worker
when handed one.

A failed or slow pull never loses the request: by policy it is recomputed here (the default) or
failed. The hand-off's states on this side (RESERVED, PULLING, COMMITTED, PARKED) are drawn in
services/engine/kv/handoff.py.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch
from opentelemetry import trace

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.engine.kv.handoff import Reservation
from baton.services.engine.requests import EngineRequest
from baton.services.worker.config import WorkerConfig
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.kv_transfer.base import (KVHandle, KVPeer, KVTransferError, KVTransport,
                                                    heads_match)
from baton.services.worker.lease_client import LeaseClient
from baton.services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)
tracer = trace.get_tracer("baton.worker")
RESERVE_RETRY_SECONDS = 0.01


class TransferFailed(RuntimeError):
    """The KV pull failed and the policy says fail: the caller gets UNAVAILABLE and may retry
    elsewhere."""


@dataclass(frozen=True)
class KVHandoff:
    """What a decode worker gets with a prefilled request: where its KV is, and the first token."""
    handle: KVHandle
    first_token_id: int
    first_logprob: TokenLogprobs | None
    # The caller streamed the first token already: the answer goes on after it without repeating it.
    first_token_streamed: bool = False


@dataclass(frozen=True)
class Served:
    """One output of a request on this worker, and where its prompt's KV came from."""
    output: RequestOutput
    kv_source: str  # "local", "transfer" or "recompute"


def peer_of(handle: KVHandle) -> KVPeer:
    return KVPeer(handle.agent_name, handle.agent_host, handle.agent_port, handle.layout,
                  handle.rank_peers, handle.head_layout)


class DecodeSide:
    def __init__(self, config: WorkerConfig, loop: EngineLoop, transport: KVTransport,
                 metrics: WorkerMetrics) -> None:
        self.config = config
        self.loop = loop
        self.transport = transport
        self.metrics = metrics
        self.leases = LeaseClient(config.transfer_timeout_seconds)
        # Prefill workers whose EAGLE head KV this worker cannot take, told once each.
        self._headless: set[str] = set()

    async def generate(self, request: EngineRequest, handoff: KVHandoff | None,
                       generated: list[int]) -> AsyncIterator[Served]:
        """Yields the request's outputs. Raises ValueError (bad request) or TransferFailed."""
        request_id = request.request_id
        arrived = time.perf_counter()
        stream = self.loop.open_stream(request_id)
        finished = False
        try:
            kv_source, first = "local", None
            if handoff is None:
                await self.loop.submit(request, output_token_ids=generated)
            else:
                kv_source, first = await self._receive(request, handoff)
            # A first token the caller streamed already is timed here but not sent again.
            unsent = first is not None and not first.finished and handoff.first_token_streamed
            timer = _Timer(self.metrics, arrived)
            out = first if first is not None else await stream.get()
            while True:
                timer.token()
                if unsent:
                    unsent = False
                else:
                    yield Served(out, kv_source)
                if out.finished:
                    finished = True
                    timer.done(out.finish_reason or "")
                    return
                out = await stream.get()
                # Behind the engine (a busy event loop or a slow reader): one message for all the
                # tokens waiting, rather than one per token, so the backlog costs less to clear.
                while not out.finished and not stream.empty():
                    out = out.then(stream.get_nowait())
        finally:
            self.loop.close_stream(request_id)
            # the caller went away, or we failed: stop the work and free the blocks
            if not finished:
                self.loop.abort_nowait(request_id)

    async def _receive(self, request: EngineRequest,
                       handoff: KVHandoff) -> tuple[str, RequestOutput | None]:
        request_id, handle = request.request_id, handoff.handle
        try:
            await self.leases.confirm(handle)
            reservation = await self._reserve(request)
        except asyncio.CancelledError:
            # The caller left before any read began: the prefill worker may free the blocks now
            # rather than when the lease runs out.
            log.info("request %s: the caller left before the KV pull; lease released", request_id)
            asyncio.ensure_future(self.leases.release(handle))
            raise
        try:
            if reservation is None:
                raise KVTransferError(
                    f"no free KV blocks within {self.config.transfer_timeout_seconds}s")
            blocks, hits, loading = reservation
            if loading:
                hits = await self._loaded(request_id, hits + loading)
            with tracer.start_as_current_span("kv_transfer", attributes={
                    "baton.request_id": request_id, "baton.transport": self.transport.name,
                    "baton.blocks": len(blocks) - hits, "baton.blocks_cached": hits}):
                await self._pull(request_id, handle, blocks, hits)
        except KVTransferError as e:
            await self._drop_reservation(request_id, e)
            return await self._fall_back(request, handoff, e)
        first = await self.loop.commit_prefilled(request_id, handoff.first_token_id,
                                                 handoff.first_logprob, self._head_row(handle))
        return "transfer", first

    def _head_row(self, handle: KVHandle) -> torch.Tensor | None:
        """The prompt's last target row when the pull moved the EAGLE head's KV too (both workers
        have a head cache of one shape); else None, and the mismatch logged once per peer."""
        local = self.transport.local_peer().head_layout
        if heads_match(local, handle.head_layout) and handle.head_row:
            return torch.frombuffer(bytearray(handle.head_row), dtype=torch.float32)
        if (local is not None or handle.head_layout is not None) and (
                handle.worker_id not in self._headless):
            self._headless.add(handle.worker_id)
            log.warning("prefill worker %s hands off no EAGLE head KV this worker can take (head "
                        "cache %s here, %s there): its prompts' drafts start a step later and "
                        "may be worse", handle.worker_id, local, handle.head_layout)
        return None

    async def _drop_reservation(self, request_id: str, error: KVTransferError) -> None:
        """Frees blocks reserved for a failed pull, or parks them while a late write may land."""
        delay = self._quarantine_s(error)
        if delay:
            log.warning("request %s: quarantining its blocks for %.0fs after a timed-out NIXL read",
                        request_id, delay)
            ticket = await self.loop.park_reserved(request_id)
            asyncio.get_running_loop().call_later(delay, self.loop.release_parked_nowait, ticket)
            return
        await self.loop.release_kv(request_id)

    def _quarantine_s(self, error: BaseException | None) -> float:
        """How long a failed read's blocks stay out of use. A timed-out NIXL READ may still land
        later (the transfer is one-sided and a stalled peer can resume), so those blocks wait until
        the peer's lease is surely over, rather than be handed to another request and
        overwritten."""
        if (isinstance(error, KVTransferError) and error.reason == "timeout"
                and self.transport.name == "nixl"):
            return self.config.lease_seconds + self.config.transfer_timeout_seconds
        return 0.0

    async def _loaded(self, request_id: str, wanted: int) -> int:
        """Waits for the reservation's blocks from this worker's own KV tiers (a copy that always
        ends); returns the leading blocks in place, counting those it did not need to pull."""
        while (in_place := await self.loop.prefilled_loaded(request_id)) is None:
            await asyncio.sleep(RESERVE_RETRY_SECONDS)
        if in_place < wanted:
            log.info("request %s: %d of its blocks failed to load from the KV tiers; pulled "
                     "instead", request_id, wanted - in_place)
        return in_place

    async def _reserve(self, request: EngineRequest) -> Reservation | None:
        deadline = time.monotonic() + self.config.transfer_timeout_seconds
        while True:
            reservation = await self.loop.reserve_prefilled(request)
            if reservation is not None or time.monotonic() > deadline:
                return reservation
            await asyncio.sleep(RESERVE_RETRY_SECONDS)

    async def _pull(self, request_id: str, handle: KVHandle, blocks: list[int], hits: int) -> None:
        if handle.transport != self.transport.name:
            raise KVTransferError(
                f"the handle is for the {handle.transport!r} transport; this worker uses "
                f"{self.transport.name!r}")
        if len(handle.block_ids) != len(blocks):
            raise KVTransferError(
                f"the handle holds {len(handle.block_ids)} blocks; this worker needs "
                f"{len(blocks)} (block sizes differ?)")
        remote, local = list(handle.block_ids[hits:]), blocks[hits:]
        # every block was already cached here: nothing to read, so tell the prefill side directly
        if not remote:
            await self.leases.release(handle)
            return
        read = asyncio.ensure_future(
            asyncio.to_thread(self.transport.read, peer_of(handle), remote, local,
                              request_id.encode(), self.config.transfer_timeout_seconds))
        try:
            await asyncio.shield(read)
        except asyncio.CancelledError:
            self._free_after(request_id, handle, read)
            raise

    def _free_after(self, request_id: str, handle: KVHandle, read: asyncio.Future) -> None:
        """The caller left mid-read. The transport's thread still writes into the reserved blocks,
        so they are parked now (ahead of the caller's abort, which would free them for reuse) and go
        back once the read has ended. A read that succeeded notified the prefill worker; one that
        failed leaves its lease to release from here."""
        log.info("request %s: the caller left during the KV pull; blocks freed when it ends",
                 request_id)
        parked = self.loop.park_reserved_nowait(request_id)

        def release(ticket: asyncio.Future[int]) -> None:
            if not ticket.cancelled() and ticket.exception() is None:
                self.loop.release_parked_nowait(ticket.result())

        def ended(_: asyncio.Future) -> None:
            error = asyncio.CancelledError() if read.cancelled() else read.exception()
            asyncio.get_running_loop().call_later(self._quarantine_s(error),
                                                  parked.add_done_callback, release)
            if error is not None:
                asyncio.ensure_future(self.leases.release(handle))

        read.add_done_callback(ended)

    async def _fall_back(self, request: EngineRequest, handoff: KVHandoff,
                         error: KVTransferError) -> tuple[str, RequestOutput | None]:
        request_id, handle = request.request_id, handoff.handle
        policy = self.config.transfer_failure_policy
        self.metrics.kv_fallbacks.labels(self.metrics.model_name, policy).inc()
        log.warning("request %s: KV pull from %s failed (%s); policy: %s", request_id,
                    handle.worker_address, error, policy)
        asyncio.ensure_future(self.leases.release(handle))
        if policy == "fail":
            raise TransferFailed(f"KV transfer from {handle.worker_address} failed: {error}")
        # A first token the client has seen is kept (recomputed as context, not drawn again).
        streamed = [handoff.first_token_id] if handoff.first_token_streamed else None
        await self.loop.submit(request, output_token_ids=streamed)
        return "recompute", None


class _Timer:
    """Per-request latency observations (TTFT, inter-token latency, end-to-end) as seen by this
    worker."""

    def __init__(self, metrics: WorkerMetrics, arrived: float) -> None:
        self.metrics, self.arrived, self.last = metrics, arrived, None

    def token(self) -> None:
        now, name = time.perf_counter(), self.metrics.model_name
        if self.last is None:
            self.metrics.ttft.labels(name).observe(now - self.arrived)
        else:
            self.metrics.itl.labels(name).observe(now - self.last)
        self.last = now

    def done(self, finish_reason: str) -> None:
        name = self.metrics.model_name
        self.metrics.e2e.labels(name).observe(time.perf_counter() - self.arrived)
        self.metrics.finished.labels(name, finish_reason).inc()

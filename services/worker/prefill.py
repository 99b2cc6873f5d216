"""The prefill side of the hand-off: run the prompt, sample the first token, hold the blocks under a
lease, and free them on the decode worker's notice or at expiry (the states:
services/engine/kv/handoff.py)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from baton.services.common.outputs import RequestOutput
from baton.services.engine.kv.handoff import HeldKV
from baton.services.engine.requests import EngineRequest
from baton.services.worker.config import WorkerConfig
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.kv_transfer.base import KVHandle, KVTransport
from baton.services.worker.leases import LeaseTable
from baton.services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)
HOUSEKEEPING_SECONDS = 0.05


class UnknownHandle(LookupError):
    """A KV handle that names no live lease (never granted, released, or expired): NOT_FOUND."""


@dataclass(frozen=True)
class Prefilled:
    """A prefill's outcome: its one output, and the KV handle when the answer goes on elsewhere
    (None when it ended here)."""
    output: RequestOutput
    kv_handle: KVHandle | None


class PrefillSide:

    def __init__(self, config: WorkerConfig, loop: EngineLoop, transport: KVTransport,
                 metrics: WorkerMetrics, worker_id: str, address: str) -> None:
        self.config = config
        self.loop = loop
        self.transport = transport
        self.metrics = metrics
        self.worker_id = worker_id
        self.address = address
        self.leases = LeaseTable(config.lease_seconds)

    async def prefill(self, request: EngineRequest) -> Prefilled:
        """Raises ValueError for requests the engine refuses. A caller that goes away (the call is
        cancelled) takes the request with it at once, wherever it is: still computing, or finished
        and holding its blocks before a lease was granted (no one could ever release those)."""
        request_id = request.request_id
        one = replace(request, params=replace(request.params, max_tokens=1))
        stream = self.loop.open_stream(request_id)
        try:
            await self.loop.submit(one, hold_kv=True)
            out = await stream.get()
            return await self._respond(request, out)
        except asyncio.CancelledError:
            log.info("request %s: the caller left during prefill; aborted", request_id)
            self.loop.abort_nowait(request_id)
            raise
        finally:
            self.loop.close_stream(request_id)

    async def _respond(self, request: EngineRequest, out: RequestOutput) -> Prefilled:
        request_id = request.request_id
        # Our max_tokens=1 cap is not an end of the answer; EOS, a stop token or string, or the
        # caller's own max_tokens=1 is, and then nothing is handed off.
        if out.finish_reason != "length" or request.params.max_tokens == 1:
            await self.loop.release_kv(request_id)
            return Prefilled(out, None)
        held = await self.loop.held_kv(request_id)
        lease = self.leases.grant(request_id)
        self.metrics.leases.labels(self.metrics.model_name).set(len(self.leases))
        return Prefilled(out, self._handle(request_id, held, len(out.prompt_token_ids),
                                           lease.expires_at))

    def _handle(self, request_id: str, held: HeldKV, num_tokens: int,
                expires_at: float) -> KVHandle:
        peer = self.transport.local_peer()
        return KVHandle(request_id=request_id, worker_id=self.worker_id,
                        worker_address=self.address, transport=self.transport.name,
                        agent_name=peer.name, agent_host=peer.host, agent_port=peer.port,
                        layout=peer.layout, block_ids=tuple(held.block_ids), num_tokens=num_tokens,
                        expires_at_unix_ms=int(expires_at * 1000),
                        block_hashes=tuple(held.block_hashes),
                        rank_peers=self.transport.rank_peers(), head_layout=peer.head_layout,
                        head_row=b"" if peer.head_layout is None or held.head_row is None
                        else held.head_row.numpy().tobytes())

    async def leased_blocks(self, request_id: str, block_ids: list[int]) -> list[int]:
        """The blocks of a live lease that a pull asks for; raises UnknownHandle otherwise."""
        gone = UnknownHandle(f"no live KV lease for request {request_id!r} "
                             "(released, expired or never granted)")
        if self.leases.get(request_id) is None:
            raise gone
        held = await self.loop.held_kv(request_id)
        if held is None:
            raise gone
        stray = set(block_ids) - set(held.block_ids)
        if stray:
            raise UnknownHandle(
                f"blocks {sorted(stray)} are not part of request {request_id!r}'s lease")
        return block_ids

    async def release(self, request_id: str) -> bool:
        if not self.leases.end(request_id):
            return False
        await self._free(request_id)
        return True

    async def _free(self, request_id: str, expired: bool = False) -> None:
        await self.loop.release_kv(request_id)
        self.metrics.leases.labels(self.metrics.model_name).set(len(self.leases))
        if expired:
            self.metrics.lease_expiries.labels(self.metrics.model_name).inc()
            log.warning(
                "request %s: KV lease expired before the decode worker released it; blocks freed",
                request_id)

    async def release_all(self) -> None:
        for request_id in self.leases.request_ids():
            await self.release(request_id)

    async def housekeeping(self) -> None:
        """Frees blocks on read notifications and at lease expiry; runs for the worker's
        lifetime."""
        while True:
            for message in self.transport.take_notifications():
                await self.release(message.decode())
            for request_id in self.leases.take_expired():
                await self._free(request_id, expired=True)
            await asyncio.sleep(HOUSEKEEPING_SECONDS)

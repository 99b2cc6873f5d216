"""The prefill side of the hand-off: run the prompt, sample the first token, hold the blocks under a lease, and
free them on the decode worker's notice or at expiry."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from baton.services.common.convert import (logprob_to_proto, prompt_logprobs_to_proto,
                                           set_stop_reason)
from baton.services.common.outputs import RequestOutput
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine
from baton.services.worker.config import WorkerConfig
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.kv_transfer.base import KVTransport, layout_to_proto
from baton.services.worker.leases import LeaseTable
from baton.services.worker.metrics import WorkerMetrics
from baton.v1 import worker_pb2 as pb

log = logging.getLogger(__name__)
HOUSEKEEPING_SECONDS = 0.05


class UnknownHandle(LookupError):
    """A KV handle that names no live lease (never granted, released, or expired): NOT_FOUND."""


class PrefillSide:
    def __init__(self, config: WorkerConfig, loop: EngineLoop, transport: KVTransport, metrics: WorkerMetrics,
                 worker_id: str, address: str) -> None:
        self.config = config
        self.loop = loop
        self.transport = transport
        self.metrics = metrics
        self.worker_id = worker_id
        self.address = address
        self.leases = LeaseTable(config.lease_seconds)

    async def prefill(self, request_id: str, prompt: list[int], params: SamplingParams, priority: int,
                      cache_salt: str | None) -> pb.PrefillResponse:
        """Raises ValueError for requests the engine refuses."""
        one = replace(params, max_tokens=1)
        stream = self.loop.open_stream(request_id)
        try:
            await self.loop.call(lambda e: e.add_request(request_id, prompt, one, priority=priority,
                                                         cache_salt=cache_salt, hold_kv=True))
            out = await stream.get()
        except asyncio.CancelledError:
            self.loop.submit(lambda e: e.abort_request(request_id))
            raise
        finally:
            self.loop.close_stream(request_id)
        return await self._respond(request_id, out, params)

    async def _respond(self, request_id: str, out: RequestOutput, params: SamplingParams) -> pb.PrefillResponse:
        response = pb.PrefillResponse(first_token_id=out.token_ids[0], num_cached_tokens=out.num_cached_tokens)
        if out.logprobs:
            response.first_logprob.CopyFrom(logprob_to_proto(out.logprobs[0]))
        if out.prompt_logprobs is not None:
            response.prompt_logprobs.extend(prompt_logprobs_to_proto(out.prompt_logprobs))
        # Our max_tokens=1 cap is not an end of the answer; EOS, a stop token or string, or the caller's own
        # max_tokens=1 is, and then nothing is handed off.
        if out.finish_reason != "length" or params.max_tokens == 1:
            await self.loop.call(lambda e: e.release_kv(request_id))
            response.finish_reason, response.text = out.finish_reason or "", out.text
            set_stop_reason(response, out.stop_reason)
            return response
        blocks, hashes = await self.loop.call(lambda e: _held_blocks(e, request_id))
        lease = self.leases.grant(request_id, blocks)
        self.metrics.leases.labels(self.metrics.model_name).set(len(self.leases))
        response.kv_handle.CopyFrom(self._handle(request_id, blocks, hashes, len(out.prompt_token_ids),
                                                 lease.expires_at))
        return response

    def _handle(self, request_id: str, blocks: list[int], hashes: list[int], num_tokens: int,
                expires_at: float) -> pb.KVHandle:
        peer = self.transport.local_peer()
        return pb.KVHandle(
            request_id=request_id, worker_id=self.worker_id, worker_address=self.address,
            transport=self.transport.name, agent_name=peer.name, agent_host=peer.host, agent_port=peer.port,
            layout=layout_to_proto(peer.layout),
            block_ids=blocks, num_tokens=num_tokens, expires_at_unix_ms=int(expires_at * 1000),
            block_hashes=hashes)

    def leased_blocks(self, request_id: str, block_ids: list[int]) -> list[int]:
        """The blocks of a live lease that a pull asks for; raises UnknownHandle otherwise."""
        lease = self.leases.get(request_id)
        if lease is None:
            raise UnknownHandle(f"no live KV lease for request {request_id!r} (released, expired or never granted)")
        stray = set(block_ids) - set(lease.block_ids)
        if stray:
            raise UnknownHandle(f"blocks {sorted(stray)} are not part of request {request_id!r}'s lease")
        return block_ids

    async def release(self, request_id: str) -> bool:
        if not self.leases.end(request_id):
            return False
        await self._free(request_id)
        return True

    async def _free(self, request_id: str, expired: bool = False) -> None:
        await self.loop.call(lambda e: e.release_kv(request_id))
        self.metrics.leases.labels(self.metrics.model_name).set(len(self.leases))
        if expired:
            self.metrics.lease_expiries.labels(self.metrics.model_name).inc()
            log.warning("request %s: KV lease expired before the decode worker released it; blocks freed",
                        request_id)

    async def release_all(self) -> None:
        for request_id in self.leases.request_ids():
            await self.release(request_id)

    async def housekeeping(self) -> None:
        """Frees blocks on read notifications and at lease expiry; runs for the worker's lifetime."""
        while True:
            for message in self.transport.take_notifications():
                await self.release(message.decode())
            for request_id in self.leases.take_expired():
                await self._free(request_id, expired=True)
            await asyncio.sleep(HOUSEKEEPING_SECONDS)


def _held_blocks(engine: LLMEngine, request_id: str) -> tuple[list[int], list[int]]:
    seq = engine.held[request_id]
    full = seq.num_prompt_tokens // engine.blocks.block_size
    return list(seq.block_ids), seq.full_block_hashes(engine.blocks.block_size, engine.model_id)[:full]

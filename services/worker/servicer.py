"""The Worker gRPC service: validates requests, maps errors to status codes, and hands work to the
prefill and decode sides. Every refusal carries a message; every failure is logged once with its
request id."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
from opentelemetry import propagate, trace

from baton.services.common.limits import MAX_PROMPT_TOKENS
from baton.services.common.roles import Role
from baton.services.common.wire.worker import (logprob_from_proto, output_to_proto,
                                               params_from_proto, prefill_to_proto)
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.lora.modules import LoRANotFound
from baton.services.engine.requests import EngineRequest
from baton.services.worker.config import WorkerConfig
from baton.services.worker.decode import DecodeSide, KVHandoff, TransferFailed
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.kv_events import KVEvent, KVEventLog
from baton.services.worker.kv_transfer.base import (KVStreamSource, KVTransferError,
                                                    kv_handle_from_proto, kv_handle_to_proto)
from baton.services.worker.lease_client import HandleNotFound
from baton.services.worker.lora_admin import MODEL_NOT_FOUND, load_adapter, unload_adapter
from baton.services.worker.prefill import PrefillSide, UnknownHandle
from baton.v1 import worker_pb2 as pb
from baton.v1 import worker_pb2_grpc

log = logging.getLogger(__name__)
tracer = trace.get_tracer("baton.worker")
EVENT_POLL_SECONDS = 0.05
PULL_BATCH = 64  # (layer, block) chunks copied per trip to a thread


def _take(chunks: Iterator[pb.KVChunk], n: int) -> list[pb.KVChunk]:
    return list(itertools.islice(chunks, n))


def _trace_context(context: grpc.aio.ServicerContext):
    return propagate.extract({k: v for k, v in context.invocation_metadata() or ()})


class WorkerServicer(worker_pb2_grpc.WorkerServicer):

    def __init__(self, config: WorkerConfig, engine: LLMEngine, loop: EngineLoop,
                 prefill: PrefillSide, decode: DecodeSide, events: KVEventLog,
                 worker_id: str) -> None:
        self.config = config
        self.engine = engine
        self.loop = loop
        self.prefill_side = prefill
        self.decode_side = decode
        self.events = events
        self.worker_id = worker_id
        self.draining = False
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def _admit(self, context: grpc.aio.ServicerContext, phase: Role, meta: pb.RequestMeta,
                     prompt: list[int]) -> str:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                "worker is draining; retry on another worker")
        if not Role.of(self.config.role).serves(phase):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"a {self.config.role} worker does not serve {phase.label}")
        if len(prompt) > MAX_PROMPT_TOKENS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prompt has {len(prompt)} tokens; at most {MAX_PROMPT_TOKENS} are accepted")
        return meta.request_id or f"req-{uuid.uuid4().hex}"

    @staticmethod
    def _request(request_id: str, meta: pb.RequestMeta, prompt: list[int],
                 params: pb.SamplingParams) -> EngineRequest:
        return EngineRequest(request_id, prompt, params_from_proto(params), meta.priority,
                             meta.cache_salt or None, meta.lora_name or None)

    def _enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()

    async def Prefill(self, request: pb.PrefillRequest,
                      context: grpc.aio.ServicerContext) -> pb.PrefillResponse:
        prompt = list(request.prompt_token_ids)
        request_id = await self._admit(context, Role.PREFILL, request.meta, prompt)
        self._enter()
        try:
            with tracer.start_as_current_span("prefill", context=_trace_context(context),
                                              attributes={"baton.request_id": request_id,
                                                          "baton.prompt_tokens": len(prompt)}):
                done = await self.prefill_side.prefill(
                    self._request(request_id, request.meta, prompt, request.params))
                handle = done.kv_handle
                return prefill_to_proto(done.output,
                                        None if handle is None else kv_handle_to_proto(handle))
        except LoRANotFound as e:  # unloaded since the gateway looked: the client's 404
            log.info("request %s: prefill refused: %s", request_id, e)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e), MODEL_NOT_FOUND)
        except ValueError as e:
            log.info("request %s: prefill refused: %s", request_id, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        finally:
            self._leave()

    async def Generate(self, request: pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        prompt = list(request.prompt_token_ids)
        request_id = await self._admit(context, Role.DECODE, request.meta, prompt)
        handoff = None
        if request.HasField("kv_handle"):
            first_lp = logprob_from_proto(
                request.first_logprob) if request.HasField("first_logprob") else None
            handoff = KVHandoff(kv_handle_from_proto(request.kv_handle), request.first_token_id,
                                first_lp, request.first_token_streamed)
        self._enter()
        try:
            with tracer.start_as_current_span("decode", context=_trace_context(context),
                                              attributes={"baton.request_id": request_id,
                                                          "baton.handoff": handoff is not None}):
                async for served in self.decode_side.generate(
                        self._request(request_id, request.meta, prompt, request.params), handoff,
                        list(request.output_token_ids)):
                    yield output_to_proto(served.output, served.kv_source)
        except LoRANotFound as e:
            log.info("request %s: generate refused: %s", request_id, e)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e), MODEL_NOT_FOUND)
        except ValueError as e:
            log.info("request %s: generate refused: %s", request_id, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except HandleNotFound as e:
            log.info("request %s: %s", request_id, e)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except TransferFailed as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            self._leave()

    async def Abort(self, request: pb.AbortRequest,
                    context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        rid = request.request_id
        if self.prefill_side.leases.confirmed(rid):
            # A decode worker took the hand-off and may be reading the blocks: it releases them.
            return pb.AbortResponse(found=True)
        leased = await self.prefill_side.release(rid)
        return pb.AbortResponse(found=await self.loop.abort(rid) or leased)

    async def UpdateLease(self, request: pb.UpdateLeaseRequest,
                          context: grpc.aio.ServicerContext) -> pb.UpdateLeaseResponse:
        if request.release:
            return pb.UpdateLeaseResponse(found=await self.prefill_side.release(request.request_id))
        lease = self.prefill_side.leases.extend(request.request_id)
        if lease is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no live KV lease for request {request.request_id!r}")
        return pb.UpdateLeaseResponse(found=True, expires_at_unix_ms=int(lease.expires_at * 1000))

    async def PullKV(self, request: pb.PullKVRequest,
                     context: grpc.aio.ServicerContext) -> AsyncIterator[pb.KVChunk]:
        transport = self.prefill_side.transport
        if not isinstance(transport, KVStreamSource):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this worker moves KV with {transport.name}")
        try:
            blocks = await self.prefill_side.leased_blocks(request.request_id,
                                                           list(request.block_ids))
            chunks = transport.stream_blocks(blocks, request.with_head)
        except UnknownHandle as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except KVTransferError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # copies off the event loop
        while batch := await asyncio.to_thread(_take, chunks, PULL_BATCH):
            for chunk in batch:
                yield chunk
        transport.record_notification(request.request_id.encode())

    async def GetStats(self, request: pb.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> pb.WorkerStats:
        s = self.engine.stats()
        fit = s.decode_fit
        decode = {} if fit is None else dict(decode_step_ms_base=fit.base_s *
                                             1e3, decode_step_ms_per_sequence=fit.per_sequence_s *
                                             1e3, decode_step_ms_per_ktoken=fit.per_token_s *
                                             1e6, decode_step_samples=fit.samples,
                                             decode_tokens_per_row_step=fit.tokens_per_row_step)
        return pb.WorkerStats(
            decode_rows=s.decode_rows, decode_context_tokens=s.decode_context_tokens, **decode,
            worker_id=self.worker_id, role=Role.of(self.config.role),
            timestamp_unix_ms=int(time.time() * 1000), num_running=s.num_running,
            num_waiting=s.num_waiting, kv_blocks_used=s.kv_blocks_total - s.kv_blocks_free,
            kv_blocks_total=s.kv_blocks_total, prefill_tokens_queued=s.prefill_tokens_queued,
            recent_step_ms=[t * 1000 for t in s.recent_step_seconds
                            ], num_leases=len(self.prefill_side.leases), draining=self.draining,
            block_size=self.engine.block_size, model=self.engine.model_id,
            max_model_len=self.engine.max_model_len,
            prefill_tokens_per_s=s.prefill_tokens_per_s or 0.0,
            lora_adapters=s.lora.registered if s.lora else [],
            loaded_loras=s.lora.resident if s.lora else [],
            host_load_seconds_per_block=s.tier_load_seconds_per_block.get("host", 0.0),
            disk_load_seconds_per_block=s.tier_load_seconds_per_block.get("disk", 0.0))

    async def LoadLoRAAdapter(self, request: pb.LoadLoRAAdapterRequest,
                              context: grpc.aio.ServicerContext) -> pb.LoadLoRAAdapterResponse:
        return await load_adapter(self.loop, request, context)

    async def UnloadLoRAAdapter(self, request: pb.UnloadLoRAAdapterRequest,
                                context: grpc.aio.ServicerContext) -> pb.UnloadLoRAAdapterResponse:
        return await unload_adapter(self.loop, request, context)

    async def StreamKVEvents(self, request: pb.StreamKVEventsRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.KVEventBatch]:
        after = request.after_sequence
        while True:
            events, gap = self.events.since(after)
            if events or gap:
                yield pb.KVEventBatch(worker_id=self.worker_id, gap=gap,
                                      events=[kv_event_to_proto(ev) for ev in events])
                after = events[-1].sequence if events else self.events.last_sequence
            await asyncio.sleep(EVENT_POLL_SECONDS)

    async def GetKVSnapshot(self, request: pb.GetKVSnapshotRequest,
                            context: grpc.aio.ServicerContext) -> pb.KVSnapshot:
        sequence, hashes = await self.loop.kv_snapshot(self.events)
        return pb.KVSnapshot(worker_id=self.worker_id, sequence=sequence,
                             block_hashes=hashes["device"], block_size=self.engine.block_size,
                             host_block_hashes=hashes.get("host", []),
                             disk_block_hashes=hashes.get("disk", []))


MEDIUMS = {"device": pb.KV_MEDIUM_DEVICE, "host": pb.KV_MEDIUM_HOST, "disk": pb.KV_MEDIUM_DISK}


def kv_event_to_proto(event: KVEvent) -> pb.KVEvent:
    kind = pb.KVEvent.KIND_STORED if event.kind == "stored" else pb.KVEvent.KIND_REMOVED
    return pb.KVEvent(sequence=event.sequence, kind=kind, block_hashes=[event.block_hash],
                      medium=MEDIUMS[event.medium])

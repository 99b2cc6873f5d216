"""Serves one choice of a request on the workers: ask the router for a placement, run prefill then
decode (or local prefill) through the hand-off client, and migrate to another decode worker when one
dies mid-stream, continuing after the tokens already streamed so nothing is duplicated or lost."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

import grpc

from baton.services.common.messages.router import PlaceRequest, Release
from baton.services.common.sampling_params import SamplingParams
from baton.services.common.wire.router import place_request_to_proto, release_to_proto
from baton.services.common.wire.worker import generate_request
from baton.services.common.worker_stubs import RECONNECT_OPTIONS, WorkerStubs
from baton.services.gateway.handoff_client import (PrefillFailed, first_token_at_prefill,
                                                   stream_tokens)
from baton.v1 import router_pb2, router_pb2_grpc, worker_pb2

log = logging.getLogger(__name__)
# A worker that died or vanished mid-call; anything else (a bad request, a refusal) is not retried
# elsewhere.
WORKER_LOST = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
               grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Refused(Exception):
    """The router or a worker refused the request; carries the HTTP status and Retry-After to answer
    with."""

    def __init__(self, status: int, message: str, code: str,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class PrefillDeadline:
    """How long a prefill worker may take to answer before the prompt is computed on the decode
    worker instead: a multiple of the request's TTFT SLO, or a fixed time without one."""
    slo_factor: float
    default_s: float

    def for_slo(self, ttft_slo_ms: float | None) -> float:
        return self.default_s if ttft_slo_ms is None else self.slo_factor * ttft_slo_ms / 1000


@dataclass
class ChoiceRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    tenant: str
    priority: int
    cache_salt: str
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None
    metadata: Sequence[tuple[str, str]] = ()  # trace context for the router and workers
    # the request's prompt_cache_key: the router keeps requests that share it on one worker
    affinity_key: str = ""
    lora_name: str | None = None  # the LoRA adapter its `model` named; None: the base model
    model: str | None = None  # the base model it runs on (an adapter's parent); None: the router's


@dataclass
class ChoiceProgress:
    tokens: list[int] = field(default_factory=list)
    migrations: int = 0
    first_token_at: float | None = None
    # the decode workers its stream broke on, which the router must not place it on again
    failed_workers: list[str] = field(default_factory=list)


def _refusal(error: grpc.aio.AioRpcError, request_id: str, peer: str) -> Refused:
    """The answer to a failed call to the router or a worker. Their own refusals (rate limits, bad
    arguments, no workers) are written for clients and passed on; anything else is a transport
    failure whose details name internal addresses, so the client gets a plain 503 and the details
    go to the log, once."""
    code, details = error.code(), error.details() or error.code().name
    trailing = dict(error.trailing_metadata() or ())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        retry_ms = trailing.get("retry-after-ms")
        return Refused(429, details, "rate_limit_exceeded",
                       float(retry_ms) / 1000 if retry_ms else 1.0)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return Refused(400, details, "invalid_value")
    if code == grpc.StatusCode.NOT_FOUND and "rejection-reason" in trailing:
        # the router routes no such model (the gateway's list of models was out of date)
        return Refused(404, details, "model_not_found")
    if "rejection-reason" in trailing:  # the router's refusal (no_workers)
        return Refused(503, f"no worker can serve this request now: {details}",
                       "service_unavailable", 1.0)
    log.warning("request %s: %s call failed: %s: %s", request_id, peer, code.name, details)
    what = "is unreachable" if code in UNREACHABLE else f"failed ({code.name})"
    return Refused(503, f"no worker can serve this request now: the {peer} {what}",
                   "service_unavailable", 1.0)


class Orchestrator:
    def __init__(self, router_address: str, max_migrations: int,
                 prefill_deadline: PrefillDeadline) -> None:
        # a short reconnect back-off: after a router outage the gateway is ready again (and serves)
        # within seconds of its return
        self.channel = grpc.aio.insecure_channel(router_address, options=RECONNECT_OPTIONS)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.max_migrations = max_migrations
        self.prefill_deadline = prefill_deadline
        self.workers = WorkerStubs()

    async def place(self, choice: ChoiceRequest, tokens: list[int],
                    excluded: Sequence[str] = ()) -> router_pb2.Placement:
        # the SLOs go in whole milliseconds, as the router reads them
        ttft, tpot = choice.ttft_slo_ms, choice.tpot_slo_ms
        request = PlaceRequest(request_id=choice.request_id,
                               prompt_token_ids=choice.prompt + tokens, tenant=choice.tenant,
                               cache_salt=choice.cache_salt or None, priority=choice.priority,
                               max_tokens=choice.params.max_tokens,
                               ttft_slo_s=int(ttft) / 1000 if ttft is not None else None,
                               tpot_slo_s=int(tpot) / 1000 if tpot is not None else None,
                               excluded_worker_ids=frozenset(excluded),
                               first_token_at_prefill=first_token_at_prefill(choice.params),
                               affinity_key=choice.affinity_key,
                               lora_name=choice.lora_name, model=choice.model)
        try:
            return await self.router.Place(place_request_to_proto(request),
                                           metadata=choice.metadata)
        except grpc.aio.AioRpcError as e:
            raise _refusal(e, choice.request_id, "router") from None

    async def run(self, choice: ChoiceRequest,
                  progress: ChoiceProgress) -> AsyncIterator[worker_pb2.GenerateResponse]:
        """Yields the choice's messages in order. Raises Refused, or grpc.aio.AioRpcError when the
        stream broke and may not move (migration off or used up)."""
        placement = await self.place(choice, [])
        placed_at = time.monotonic()
        failed_worker = ""
        local = False  # set when the placed prefill worker failed: the decode worker computes
        try:
            while True:
                try:
                    async for message in self._attempt(choice, placement, progress.tokens, local):
                        if message.token_ids and progress.first_token_at is None:
                            progress.first_token_at = time.monotonic()
                        progress.tokens += message.token_ids
                        yield message
                    return
                except PrefillFailed as e:
                    if e.code() not in WORKER_LOST:
                        raise _refusal(e, choice.request_id, "prefill worker") from None
                    log.warning("request %s: prefill worker %s failed (%s: %s); prefilling on "
                                "decode worker %s instead", choice.request_id,
                                placement.prefill_worker_id, e.code().name, e.details(),
                                placement.decode_worker_id)
                    failed_worker, local = placement.prefill_worker_id, True
                except grpc.aio.AioRpcError as e:
                    if e.code() not in WORKER_LOST or progress.migrations >= self.max_migrations:
                        if e.code() not in WORKER_LOST:
                            raise _refusal(e, choice.request_id, "worker") from None
                        raise
                    failed_worker = placement.decode_worker_id
                    log.warning("request %s: worker %s lost after %d tokens (%s); migrating",
                                choice.request_id, failed_worker, len(progress.tokens),
                                e.code().name)
                    # released once, even if the new place() fails
                    released, placement = placement, None
                    await self._release(released, progress, failed_worker, placed_at)
                    progress.migrations += 1
                    progress.failed_workers.append(failed_worker)
                    placement = await self.place(choice, progress.tokens, progress.failed_workers)
                    placed_at = time.monotonic()
                    failed_worker, local = "", False
        finally:
            if placement is not None:
                await asyncio.shield(self._release(placement, progress, failed_worker, placed_at))

    def _attempt(self, choice: ChoiceRequest, placement: router_pb2.Placement, tokens: list[int],
                 local: bool) -> AsyncIterator[worker_pb2.GenerateResponse]:
        meta = worker_pb2.RequestMeta(request_id=choice.request_id, priority=choice.priority,
                                      cache_salt=choice.cache_salt,
                                      lora_name=choice.lora_name or "")
        decode = self.workers.get(placement.decode_address)
        # a migration: the new decode worker recomputes prompt and tokens so far, and goes on
        if tokens:
            # the first message already carried the prompt's logprobs
            params = replace(choice.params, prompt_logprobs=None)
            return decode.Generate(generate_request(meta, choice.prompt, params, tokens),
                                   metadata=choice.metadata)
        remote = (placement.prefill_mode == router_pb2.PREFILL_MODE_REMOTE and
                  placement.prefill_address and not local)
        prefill = self.workers.get(placement.prefill_address) if remote else None
        return stream_tokens(decode, prefill, meta, choice.prompt, choice.params, choice.metadata,
                             self.prefill_deadline.for_slo(choice.ttft_slo_ms))

    async def _release(self, placement: router_pb2.Placement, progress: ChoiceProgress, failed: str,
                       placed_at: float) -> None:
        # The router learns prefill rates from placement to first token of a fresh prefill, so only
        # the placement the first token came on reports it (a later one recomputed the stream).
        first, ttft_s = progress.first_token_at, None
        if first is not None and first >= placed_at:
            ttft_s = first - placed_at
        release = Release(placement.lease_id, ttft_s, len(progress.tokens), failed or None)
        try:
            await self.router.Release(release_to_proto(release), timeout=5)
        except grpc.aio.AioRpcError as e:  # the lease expires on the router's side anyway
            log.info("request %s: lease release failed: %s", placement.request_id, e.code().name)

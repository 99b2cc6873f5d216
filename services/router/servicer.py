"""The Router gRPC service (baton.v1.Router) over the Router facade: its messages decoded and
encoded in services/common/wire/router.py, status codes, and the wait of queued requests.

The facade is called inline on the event loop (a decision takes well under a millisecond and does no
I/O). A queued request awaits a future that the facade's on_queued_outcome callback settles; a
refusal is answered with RESOURCE_EXHAUSTED (UNAVAILABLE when no worker can take it), its reason and
retry-after hint both in the message and in trailing metadata (`rejection-reason`, `retry-after-ms`,
and the Rejection message as `baton-rejection-bin`).
"""
from __future__ import annotations

import asyncio
import logging
import math

import grpc
from opentelemetry import propagate, trace

from baton.services.common.messages.router import Placement
from baton.services.common.roles import Role
from baton.services.common.wire.router import (place_request_from_proto, placement_to_proto,
                                               release_from_proto, router_stats_to_proto)
from baton.services.router.rejections import Rejection
from baton.services.router.router import Outcome, Router
from baton.services.router.worker_feeds import FeedSet
from baton.v1 import router_pb2 as pb
from baton.v1 import router_pb2_grpc

log = logging.getLogger(__name__)
tracer = trace.get_tracer("baton.router")


def retry_after_ms(rejection: Rejection) -> int:
    return 0 if rejection.retry_after_s is None else max(1, math.ceil(rejection.retry_after_s *
                                                                      1000))


def rejection_status(
        rejection: Rejection) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
    """(code, message, trailing metadata) of a refused Place."""
    wait_ms = retry_after_ms(rejection)
    message = f"{rejection.reason.value}: {rejection.message}" + (f" (retry after {wait_ms} ms)"
                                                                  if wait_ms else "")
    detail = pb.Rejection(request_id=rejection.request_id, reason=rejection.reason.value,
                          message=rejection.message, retry_after_ms=wait_ms)
    trailers = (("rejection-reason", rejection.reason.value), ("retry-after-ms", str(wait_ms)),
                ("baton-rejection-bin", detail.SerializeToString()))
    return getattr(grpc.StatusCode, rejection.reason.grpc_status), message, trailers


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, router: Router, feeds: FeedSet, loop: asyncio.AbstractEventLoop) -> None:
        self.router = router
        self.feeds = feeds
        self.loop = loop
        self._waiting: dict[str, asyncio.Future[Outcome]] = {}

    def on_queued_outcome(self, outcome: Outcome) -> None:
        """The facade's callback, run under its lock: only hands the outcome to the loop."""
        self.loop.call_soon_threadsafe(self._settle, outcome)

    def _settle(self, outcome: Outcome) -> None:
        future = self._waiting.pop(outcome.request_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)
        elif isinstance(outcome, Placement):
            # The caller gave up while queued; nobody will use or release this lease, so free it
            # now.
            log.info("request %s: placed after its caller left; lease released", outcome.request_id)
            self.router.release(outcome.lease_id)

    async def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                             context: grpc.aio.ServicerContext) -> pb.RegisterWorkerResponse:
        if (request.role == pb.WORKER_ROLE_UNSPECIFIED or
                request.role not in Role._value2member_map_):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "role must be prefill, decode or mixed")
        try:
            expires = self.router.register_worker(request.worker_id, request.address,
                                                  Role(request.role), request.model or None,
                                                  request.block_size or None)
        except ValueError as e:
            log.info("worker %s: registration refused: %s", request.worker_id, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.feeds.ensure_registered(request.worker_id, request.address)
        return pb.RegisterWorkerResponse(
            lease_expires_at_unix_ms=int(expires * 1000),
            lease_ttl_ms=int(self.router.config.worker_lease_ttl_s * 1000))

    async def Heartbeat(self, request: pb.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        try:
            expires = self.router.heartbeat(request.worker_id)
        except KeyError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"worker {request.worker_id!r} is not registered; "
                "register again")
        return pb.HeartbeatResponse(lease_expires_at_unix_ms=int(expires * 1000))

    async def Place(self, request: pb.PlaceRequest,
                    context: grpc.aio.ServicerContext) -> pb.Placement:
        parent = propagate.extract(
            {k: v
             for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        with tracer.start_as_current_span(
                "router.place", context=parent, attributes={
                    "baton.request_id": request.request_id,
                    "baton.prompt_tokens": len(request.prompt_token_ids)
                }) as span:
            outcome = await self._place(request, context)
            span.set_attribute("baton.outcome",
                               "placed" if isinstance(outcome, Placement) else "refused")
            if isinstance(outcome, Rejection):
                span.set_attribute("baton.rejection_reason", outcome.reason.value)
                code, message, trailers = rejection_status(outcome)
                # Refusals are counted by reason (baton_router_rejections_total); a log line apiece
                # would add I/O to every refusal just when the router is busiest.
                log.debug("request %s: refused: %s", outcome.request_id, message)
                await context.abort(code, message, trailing_metadata=trailers)
            span.set_attribute("baton.decode_worker", outcome.decode_worker_id)
            return placement_to_proto(outcome)

    async def _place(self, request: pb.PlaceRequest, context: grpc.aio.ServicerContext) -> Outcome:
        try:
            req = place_request_from_proto(request)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if req.request_id in self._waiting:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS,
                                f"request {req.request_id!r} is already waiting")
        # Registered before deciding, so an outcome settled from inside a later call always finds
        # its waiter.
        future: asyncio.Future[Outcome] = self.loop.create_future()
        self._waiting[req.request_id] = future
        try:
            outcome = self.router.place(req)
        except ValueError as e:
            self._waiting.pop(req.request_id, None)
            log.info("request %s: bad placement request: %s", req.request_id, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if isinstance(outcome, (Placement, Rejection)):
            self._waiting.pop(req.request_id, None)
            return outcome
        try:
            return await future
        finally:
            self._waiting.pop(req.request_id, None)

    async def Release(self, request: pb.ReleaseRequest,
                      context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        release = release_from_proto(request)
        try:
            self.router.release(release.lease_id, release.observed_ttft_s, release.output_tokens,
                                release.failed_worker_id)
        except KeyError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no open lease {request.lease_id!r} (released "
                "twice, or expired)")
        return pb.ReleaseResponse()

    async def Drain(self, request: pb.DrainRequest,
                    context: grpc.aio.ServicerContext) -> pb.DrainResponse:
        unknown = self.router.drain(request.worker_ids)
        log.info("draining %s", [w for w in request.worker_ids if w not in unknown])
        return pb.DrainResponse(unknown_worker_ids=unknown)

    async def GetStats(self, request: pb.GetRouterStatsRequest,
                       context: grpc.aio.ServicerContext) -> pb.RouterStats:
        return router_stats_to_proto(self.router.stats())

    async def ListWorkers(self, request: pb.ListWorkersRequest,
                          context: grpc.aio.ServicerContext) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(workers=[
            pb.WorkerEndpoint(worker_id=worker_id, address=address, role=role.value,
                              draining=draining, model=model)
            for worker_id, address, role, draining, model in self.router.endpoints()])

    async def SetRuntimeLoRA(self, request: pb.SetRuntimeLoRARequest,
                             context: grpc.aio.ServicerContext) -> pb.SetRuntimeLoRAResponse:
        try:
            self.router.runtime_loras.set(request.model or None, request.lora_name,
                                         request.lora_path or None, request.worker_ids)
        except KeyError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, e.args[0])
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log.info("runtime LoRA adapter %s of %s: %s", request.lora_name,
                 request.model or self.router.config.model,
                 f"wanted from {request.lora_path}" if request.lora_path else "no longer wanted")
        return pb.SetRuntimeLoRAResponse()

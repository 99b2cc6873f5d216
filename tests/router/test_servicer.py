"""The Router servicer in process: a Place carries the caller's trace context into its span, and a
queued request is answered once capacity frees up."""
from __future__ import annotations

import asyncio

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.services.common.roles import Role
from baton.services.router.config import RouterConfig
from baton.services.router.router import Router
from baton.services.router.servicer import RouterServicer
from baton.services.router.worker_feeds import FeedSet
from baton.v1 import router_pb2 as rpb
from baton.v1 import router_pb2_grpc

from .helpers import Clock, report

EXPORTER = InMemorySpanExporter()


def setup_module() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


async def _serve(router_config: RouterConfig, clock: Clock) -> tuple[grpc.aio.Server, Router, str]:
    loop = asyncio.get_running_loop()
    router = Router(router_config, clock=clock,
                    on_queued_outcome=lambda o: servicer.on_queued_outcome(o))
    servicer = RouterServicer(router, FeedSet(router, 1.0, 1.0), loop)
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    router.register_worker("d0", "d0:1", Role.DECODE, lease_ttl_s=float("inf"))
    return server, router, f"127.0.0.1:{port}"


async def _trace_and_queue() -> None:
    clock = Clock()
    # One request fills the only worker (saturation at one in-flight request), so the next one
    # queues.
    config = RouterConfig(model="m", saturation_inflight_requests=1, sticky_inflight_requests=1)
    server, router, address = await _serve(config, clock)
    router.on_stats(report("d0", clock()))
    stub = router_pb2_grpc.RouterStub(grpc.aio.insecure_channel(address))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("gateway") as parent:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        first = await stub.Place(rpb.PlaceRequest(request_id="r1", prompt_token_ids=[1] * 64),
                                 metadata=tuple(carrier.items()))
    place_span = next(s for s in EXPORTER.get_finished_spans() if s.name == "router.place")
    assert place_span.context.trace_id == parent.get_span_context().trace_id
    assert place_span.parent.span_id == parent.get_span_context().span_id
    waiting = asyncio.ensure_future(
        stub.Place(rpb.PlaceRequest(request_id="r2", prompt_token_ids=[2] * 64)))
    await asyncio.sleep(0.2)
    assert not waiting.done() and router.stats().queued_requests == 1
    await stub.Release(rpb.ReleaseRequest(lease_id=first.lease_id))
    second = await asyncio.wait_for(waiting, 5)
    assert second.request_id == "r2" and second.decode_worker_id == "d0"
    await server.stop(None)


def test_place_span_continues_the_callers_trace_and_queued_requests_get_answered():
    asyncio.run(_trace_and_queue())

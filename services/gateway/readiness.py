"""Whether the gateway can serve: /ready answers 503 while the router does not answer its gRPC
health check (every request would get a 503 then), so a load balancer sends clients to gateways
that can place their requests.

The check runs in the background on the channel requests use, every `router_check_interval_s`;
the probes (on the API port and on the metrics port's thread) read its last answer. A change is
logged once, with the gRPC details (which name the router's address) kept out of any response."""
from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Gauge

from baton.v1 import router_pb2

log = logging.getLogger(__name__)
ROUTER_SERVICE = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


class RouterHealth:
    def __init__(self, channel: grpc.aio.Channel, interval_s: float, up: Gauge) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self.interval_s = interval_s
        self.up = up
        self.problem: str | None = "the router has not been checked yet"

    async def check(self) -> None:
        request = health_pb2.HealthCheckRequest(service=ROUTER_SERVICE)
        try:
            reply = await self._stub.Check(request, timeout=self.interval_s)
        except grpc.aio.AioRpcError as e:
            self._set("the router is unreachable", f"{e.code().name}: {e.details()}")
            return
        serving = reply.status == health_pb2.HealthCheckResponse.SERVING
        self._set(None if serving else "the router is not serving",
                  health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def _set(self, problem: str | None, detail: str) -> None:
        if problem != self.problem:
            if problem is None:
                log.info("the router answers its health check: ready")
            else:
                log.warning("not ready: %s (%s)", problem, detail)
        self.problem = problem
        self.up.set(0 if problem else 1)

    async def watch(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)

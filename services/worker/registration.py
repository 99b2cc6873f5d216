"""A worker's registration with a router: RegisterWorker, then heartbeats at a third of the lease
the router grants, registering again whenever the router no longer knows it (a router restart, a
missed lease)."""
from __future__ import annotations

import asyncio
import logging

import grpc

from baton.services.common.roles import Role
from baton.v1 import router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)
RETRY_SECONDS = 1.0


async def keep_registered(router_address: str, worker_id: str, address: str, role: str, model: str,
                          block_size: int) -> None:
    """Runs for the worker's lifetime; cancel it to stop heartbeating (the router then drops the
    worker when its lease runs out)."""
    stub = router_pb2_grpc.RouterStub(grpc.aio.insecure_channel(router_address))
    register = router_pb2.RegisterWorkerRequest(worker_id=worker_id, address=address,
                                                role=Role.of(role).value, model=model,
                                                block_size=block_size)
    ttl_s: float | None = None
    while True:
        try:
            if ttl_s is None:
                granted = await stub.RegisterWorker(register, timeout=5)
                ttl_s = granted.lease_ttl_ms / 1000
                log.info("registered with router %s (lease %.1fs)", router_address, ttl_s)
            else:
                await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id=worker_id), timeout=5)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                log.error("router %s refused this worker: %s", router_address, e.details())
            elif ttl_s is not None or e.code() != grpc.StatusCode.UNAVAILABLE:
                log.warning("router %s: %s (%s); registering again", router_address,
                            e.code().name, e.details())
            ttl_s = None
        await asyncio.sleep(ttl_s / 3 if ttl_s else RETRY_SECONDS)

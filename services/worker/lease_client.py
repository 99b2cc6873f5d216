"""The decode side's calls to a prefill worker about a hand-off's lease (UpdateLease): confirm it,
which also keeps its blocks alive for the read, and release it once the blocks are copied or given
up. The one place the decode side speaks the worker protocol as a client."""
from __future__ import annotations

import logging
import time

import grpc

from baton.services.common.worker_stubs import WorkerStubs
from baton.services.worker.kv_transfer.base import KVHandle
from baton.v1 import worker_pb2 as pb

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 5.0


class HandleNotFound(LookupError):
    """The prefill worker is alive but holds no such lease (expired, released or never granted):
    NOT_FOUND."""


class LeaseClient:
    def __init__(self, confirm_timeout_s: float) -> None:
        self.confirm_timeout_s = confirm_timeout_s
        self.workers = WorkerStubs()

    async def confirm(self, handle: KVHandle) -> None:
        """Extends the lease before reading: a one-sided NIXL READ cannot tell live blocks from
        reused ones, so a handle is checked (and kept alive for the read) first. An unreachable
        prefill worker is left to the pull's failure path, which recomputes."""
        if handle.expires_at_unix_ms < time.time() * 1000:
            raise HandleNotFound(f"KV handle for request {handle.request_id!r} expired")
        try:
            await self.workers.get(handle.worker_address).UpdateLease(
                pb.UpdateLeaseRequest(request_id=handle.request_id),
                timeout=self.confirm_timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise HandleNotFound(e.details()) from None

    async def release(self, handle: KVHandle) -> None:
        """Best effort: a dead prefill worker's blocks are gone anyway, and a live one's lease
        expires."""
        try:
            await self.workers.get(handle.worker_address).UpdateLease(
                pb.UpdateLeaseRequest(request_id=handle.request_id, release=True),
                timeout=RELEASE_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.info("request %s: could not release its lease on %s: %s", handle.request_id,
                     handle.worker_address, e.code().name)

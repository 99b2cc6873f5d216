"""Runtime LoRA updates (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter), fanned out to
every worker serving the adapter's base model: the router lists the workers and their models
(ListWorkers), and the gateway calls each one's LoadLoRAAdapter or UnloadLoRAAdapter at once, as
it calls workers for requests.

A load is all or nothing: when a worker refuses it, the workers that took it unload it again and
the client gets the refusal. A worker that already serves the name while the others take it counts
as done. Once the workers have it, the router records it as the fleet's desired state
(SetRuntimeLoRA; services/router/runtime_loras.py) and loads it onto workers that join later; an
unload tells the router first, so it loads it nowhere again. An unload succeeds when any worker
served the adapter; it is a 404 when none did.

Each load and unload is recorded (services/gateway/lora_record.py: the state store, or without
one this gateway's memory), and the gateways re-assert the record to a router that has forgotten
it (services/gateway/lora_reconcile.py). The record is written once the workers took a load and
before the router is told; an unload deletes it first. A store that does not answer refuses the
update with a 503 before anything changed, or undoes what it did (a load's workers unload again).

The base model's list of adapters (what `model` may name, /v1/models) changes at once; the router's
view follows with the workers' next stats. Until it agrees, the change is kept over what the router
reports (at most PENDING_MAX_S), so a stale report neither revives an unloaded adapter nor hides a
loaded one."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from baton.services.common.worker_stubs import WorkerStubs
from baton.services.gateway.lora_record import LoRARecord
from baton.services.gateway.served_model import ServedModel
from baton.services.state.urls import StoreUnavailable
from baton.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
LIST_TIMEOUT_S = 10.0
# Reading a large adapter from a slow volume takes a while; the engine keeps serving meanwhile.
LOAD_TIMEOUT_S = 300.0
UNLOAD_TIMEOUT_S = 30.0
PENDING_MAX_S = 60.0
# A worker's refusal as the client's status and error code.
STATUS = {grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_value"),
          grpc.StatusCode.ALREADY_EXISTS: (400, "invalid_value"),
          grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_value"),
          grpc.StatusCode.NOT_FOUND: (404, "model_not_found")}


class UpdateFailed(Exception):
    """The update's answer to the client: an HTTP status, message and OpenAI error code, and what
    the log says of it (`detail`, which may name internal addresses the client is not told)."""

    def __init__(self, status: int, message: str, code: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.detail = detail or message


def _failure(error: grpc.aio.AioRpcError, peer: str) -> UpdateFailed:
    """A worker's refusal, passed on; a transport failure is a plain 503."""
    details = error.details() or error.code().name
    if error.code() in STATUS:
        status, code = STATUS[error.code()]
        return UpdateFailed(status, details, code)
    return UpdateFailed(503, f"the {peer} is unavailable ({error.code().name}); try again",
                        "service_unavailable", f"{peer}: {error.code().name}: {details}")


def _store_failure(error: StoreUnavailable) -> UpdateFailed:
    return UpdateFailed(503, f"{error}; nothing was changed, try again",
                        "state_store_unavailable", f"state store: {error.__cause__ or error}")


class LoRAUpdates:
    def __init__(self, channel: grpc.aio.Channel, stubs: WorkerStubs,
                 record: LoRARecord) -> None:
        self.router = router_pb2_grpc.RouterStub(channel)
        self.stubs, self.record = stubs, record
        self._lock = asyncio.Lock()  # one update at a time: a load and an unload never interleave

    async def load(self, request_id: str, model: ServedModel, name: str, path: str) -> None:
        """Raises UpdateFailed."""
        async with self._lock:
            await self._recorded()  # a store that is down refuses it before any worker loads
            message = worker_pb2.LoadLoRAAdapterRequest(lora_name=name, lora_path=path)
            results = await self._each_worker(
                model.name, lambda stub: stub.LoadLoRAAdapter(message, timeout=LOAD_TIMEOUT_S))
            took = [w for w, r in results if not isinstance(r, Exception)]
            errors = [r for _, r in results if isinstance(r, grpc.aio.AioRpcError)]
            if errors and not (took and all(e.code() == grpc.StatusCode.ALREADY_EXISTS
                                            for e in errors)):
                await self._roll_back(request_id, name, [w.address for w in took])
                raise _failure(errors[0], "worker")
            # every worker listed serves it now; the router brings later ones up to date
            try:
                await self._record(self.record.add(model.name, name, path))
                try:
                    await self._tell_router(model.name, name, path,
                                            [w.worker_id for w, _ in results])
                except UpdateFailed:
                    await self._undo(request_id, self.record.remove(model.name, name))
                    raise
            except UpdateFailed:
                await self._roll_back(request_id, name, [w.address for w in took])
                raise
            _pending(model, name, present=True)

    async def unload(self, request_id: str, model: ServedModel, name: str) -> int:
        """Returns the requests still finishing under the adapter. Raises UpdateFailed."""
        async with self._lock:
            # the record first, so no gateway re-asserts it; then the router, so it loads it onto
            # no worker again
            path = (await self._recorded()).get((model.name, name))
            await self._record(self.record.remove(model.name, name))
            try:
                await self._tell_router(model.name, name, "", [])
            except UpdateFailed:
                if path is not None:
                    await self._undo(request_id, self.record.add(model.name, name, path))
                raise
            message = worker_pb2.UnloadLoRAAdapterRequest(lora_name=name)
            results = await self._each_worker(
                model.name, lambda stub: stub.UnloadLoRAAdapter(message, timeout=UNLOAD_TIMEOUT_S))
            done = [r for _, r in results if not isinstance(r, Exception)]
            if done:
                _pending(model, name, present=False)
            errors = [r for _, r in results if isinstance(r, grpc.aio.AioRpcError)
                      and r.code() != grpc.StatusCode.NOT_FOUND]
            if errors or not done:
                raise _failure((errors or [r for _, r in results])[0], "worker")
            return sum(r.finishing_requests for r in done)

    async def _recorded(self) -> dict[tuple[str, str], str]:
        return await self._record(self.record.all())

    @staticmethod
    async def _record(operation: Awaitable[T]) -> T:
        try:
            return await operation
        except StoreUnavailable as e:
            raise _store_failure(e) from None

    @staticmethod
    async def _undo(request_id: str, operation: Awaitable[None]) -> None:
        """Puts the record back after the router refused; a store down by now is logged."""
        try:
            await operation
        except StoreUnavailable as e:
            log.warning("request %s: the LoRA adapters' record could not be put back: %s",
                        request_id, e)

    async def _tell_router(self, model: str, name: str, path: str,
                           worker_ids: list[str]) -> None:
        """The fleet's desired state (services/router/runtime_loras.py)."""
        request = router_pb2.SetRuntimeLoRARequest(model=model, lora_name=name, lora_path=path,
                                                   worker_ids=worker_ids)
        try:
            await self.router.SetRuntimeLoRA(request, timeout=LIST_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise _failure(e, "router") from None

    async def _each_worker(self, model: str,
                           call: Callable[[worker_pb2_grpc.WorkerStub], Awaitable[T]]
                           ) -> list[tuple[router_pb2.WorkerEndpoint, T | grpc.aio.AioRpcError]]:
        """Each live worker's of `model` answer (or its error)."""
        try:
            listing = await self.router.ListWorkers(router_pb2.ListWorkersRequest(),
                                                    timeout=LIST_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise _failure(e, "router") from None
        workers = sorted((w for w in listing.workers if w.model == model),
                         key=lambda w: w.address)
        if not workers:
            raise UpdateFailed(503, f"no worker is serving {model} now; try again once one is",
                               "service_unavailable")
        answers = await asyncio.gather(*(call(self.stubs.get(w.address)) for w in workers),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, Exception) and not isinstance(answer, grpc.aio.AioRpcError):
                raise answer
        return list(zip(workers, answers))

    async def _roll_back(self, request_id: str, name: str, addresses: list[str]) -> None:
        message = worker_pb2.UnloadLoRAAdapterRequest(lora_name=name)
        for address in addresses:
            try:
                await self.stubs.get(address).UnloadLoRAAdapter(message, timeout=UNLOAD_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                log.warning("request %s: LoRA adapter %s stays on a worker after a failed load: "
                            "%s: %s", request_id, name, e.code().name, e.details())


def _pending(model: ServedModel, name: str, present: bool) -> None:
    model.lora_pending[name] = (present, time.monotonic())
    adapters = set(model.lora_adapters)
    model.lora_adapters = frozenset(adapters | {name} if present else adapters - {name})


def with_pending(pending: dict[str, tuple[bool, float]],
                 reported: frozenset[str]) -> frozenset[str]:
    """The adapters the router reports, with the gateway's own recent updates (`pending`, by name:
    loaded or not, and since when) over them; an update is forgotten once the report agrees with
    it, or after PENDING_MAX_S."""
    adapters, now = set(reported), time.monotonic()
    for name, (present, since) in list(pending.items()):
        if (name in reported) == present or now - since > PENDING_MAX_S:
            del pending[name]
        elif present:
            adapters.add(name)
        else:
            adapters.discard(name)
    return frozenset(adapters)

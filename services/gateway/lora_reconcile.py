"""Re-asserts the gateway's record of runtime LoRA adapters (services/gateway/lora_record.py) to
the router, which holds them only in memory (services/router/runtime_loras.py): a router that
restarted has forgotten them, and would neither load them onto workers that join later nor keep
requests for them off workers that lack them.

The router's GetStats, which the gateway asks every router_check_interval_s anyway
(services/gateway/worker_limits.py), lists each model's desired adapters. When that list loses an
entry it had, or lacks one of the record as last read, the record is read again and whatever the
router lacks is sent to it (SetRuntimeLoRA is idempotent); the record is also read every
--lora-reconcile-interval-s, and once at start. Several gateways on one PostgreSQL each do this
over the same table, so any one of them restores the set. An unload deletes the row before it
tells the router, so after re-asserting, the record is read once more and whatever it lost
meanwhile is unloaded again: a re-assert racing another gateway's unload never revives it.

Only adapters the router lacks are sent: an entry the router holds that the record lacks may be
another gateway's (each on its own SQLite file), and is left to the unload that removes it."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import grpc

from baton.services.common.messages.router import ModelStats
from baton.services.common.wire.router import router_stats_from_proto
from baton.services.gateway.lora_record import LoRARecord
from baton.services.state.lora_repo import Recorded
from baton.services.state.urls import StoreUnavailable
from baton.v1 import router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0


class LoRAReconciler:
    def __init__(self, record: LoRARecord, channel: grpc.aio.Channel, interval_s: float) -> None:
        self.record, self.interval_s = record, interval_s
        self._router = router_pb2_grpc.RouterStub(channel)
        self._known: Recorded = {}  # the record as last read
        self._reported: Recorded | None = None  # the router's desired set, as last reported
        self._wake = asyncio.Event()
        self._problem: str | None = None

    def router_reports(self, served: Iterable[ModelStats]) -> None:
        """One GetStats answer's models: wakes the reconcile when the router forgot something."""
        served = list(served)
        reported = _desired(served)
        before, self._reported = self._reported, reported
        lost = before is not None and any(key not in reported for key in before)
        if lost or _missing(self._known, reported, {m.name for m in served}):
            self._wake.set()

    @property
    def due(self) -> bool:
        """Whether the router's stats have woken a reconcile not run yet."""
        return self._wake.is_set()

    async def reconcile(self) -> int:
        """Sends the router what it lacks of the record; how many adapters. A store or router
        that does not answer is logged (once) and tried again at the next wake."""
        self._wake.clear()  # what woke it is read now
        try:
            return await self._reconcile()
        except StoreUnavailable as e:
            self._set_problem(f"the state store: {e}")
        except grpc.aio.AioRpcError as e:
            self._set_problem(f"the router: {e.code().name}: {e.details()}")
        return 0

    async def _reconcile(self) -> int:
        recorded = await self.record.all()
        self._known = recorded
        stats = router_stats_from_proto(await self._router.GetStats(
            router_pb2.GetRouterStatsRequest(), timeout=CALL_TIMEOUT_S))
        served = stats.served_models
        missing = _missing(recorded, _desired(served), {m.name for m in served})
        for (model, name), path in missing.items():
            await self._tell(model, name, path)
            log.info("re-asserted runtime LoRA adapter %s of %s (from %s) to the router", name,
                     model, path)
        if missing:
            again = await self.record.all()
            for (model, name), path in missing.items():
                if again.get((model, name)) != path:
                    await self._tell(model, name, again.get((model, name), ""))
            self._known = again
        self._set_problem(None)
        return len(missing)

    async def _tell(self, model: str, name: str, path: str) -> None:
        request = router_pb2.SetRuntimeLoRARequest(model=model, lora_name=name, lora_path=path)
        await self._router.SetRuntimeLoRA(request, timeout=CALL_TIMEOUT_S)

    def _set_problem(self, problem: str | None) -> None:
        if problem != self._problem:
            if problem is None:
                log.info("runtime LoRA adapters: the router agrees with the record again")
            else:
                log.warning("runtime LoRA adapters not re-asserted: %s; tried again", problem)
        self._problem = problem

    async def watch(self) -> None:
        """At start, then at each wake or every interval_s."""
        while True:
            await self.reconcile()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)


def _desired(served: Iterable[ModelStats]) -> Recorded:
    return {(m.name, name): path for m in served for name, path in m.runtime_loras}


def _missing(recorded: Recorded, reported: Recorded, models: set[str]) -> Recorded:
    """What the record has and the router lacks (or holds from another folder), for the models
    the router routes."""
    return {key: path for key, path in recorded.items()
            if key[0] in models and reported.get(key) != path}

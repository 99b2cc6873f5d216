"""What the workers behind the router serve: the model's name and the longest sequence they accept.

The gateway refuses an over-long request itself, with OpenAI's `context_length_exceeded` error
naming the limit, and /v1/models reports the limit; both must be the workers' limit, whatever the
gateway was started with (workers started with their own --max-model-len, a gateway that only has
the checkpoint's default). The router's GetStats carries the smallest limit its live workers report
and the served name; the gateway asks at start and then every `router_check_interval_s`, beside the
router health check. An explicit --max-model-len on the gateway can only lower the limit, and an
explicit --served-model-name keeps the name."""
from __future__ import annotations

import asyncio
import logging
import time

import grpc

from baton.services.common.messages.router import ModelStats
from baton.services.common.wire.router import router_stats_from_proto
from baton.services.gateway.lora_updates import with_pending
from baton.services.gateway.served_model import ServedModel
from baton.services.gateway.state import Gateway
from baton.v1 import router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)
# At start, how long to wait for a reachable router to report its workers' limit (it polls their
# stats every half second); past it the gateway starts with the checkpoint's and learns later.
FIRST_REPORT_WAIT_S = 3.0
FIRST_REPORT_POLL_S = 0.1


class WorkerLimits:

    def __init__(self, gateway: Gateway, channel: grpc.aio.Channel, interval_s: float) -> None:
        self.gateway = gateway
        self.interval_s = interval_s
        self._stub = router_pb2_grpc.RouterStub(channel)

    async def check(self) -> bool | None:
        """Asks the router once and applies what it says: True when the workers' limit is known,
        False when no worker has reported one yet, None when the router did not answer (the health
        check reports that)."""
        try:
            stats = router_stats_from_proto(
                await self._stub.GetStats(router_pb2.GetRouterStatsRequest(),
                                          timeout=self.interval_s))
        except grpc.aio.AioRpcError:
            return None
        # A router of one model (an older one lists none) reports it in the top-level fields.
        served = stats.served_models or (ModelStats(stats.model, stats.max_model_len,
                                                     stats.lora_adapters),)
        self._rename_default(served[0].name)
        if self.gateway.lora_reconciler is not None:
            self.gateway.lora_reconciler.router_reports(stats.served_models)
        for entry in served:
            model = self.gateway.models.get(entry.name)
            if model is None:
                continue  # the router routes a model this gateway has no tokenizer for
            model.lora_adapters = with_pending(model.lora_pending,
                                               frozenset(entry.lora_adapters))
            if entry.max_model_len:
                self._apply(model, entry.max_model_len)
        return bool(served[0].max_model_len)

    def _rename_default(self, routed: str) -> None:
        """The default model takes the router's name for it unless --served-model-name set one."""
        gateway = self.gateway
        default = gateway.default_model
        if (not routed or gateway.config.served_model_name or routed == default.name
                or routed in gateway.models):
            return
        log.info("the workers serve %s (the gateway had %s)", routed, default.name)
        default.name = routed
        gateway.models = {m.name: m for m in gateway.models.values()}

    def _apply(self, model: ServedModel, workers_limit: int) -> None:
        config = self.gateway.config
        limit = min(workers_limit, config.max_model_len or workers_limit)
        if limit == model.max_model_len:
            return
        log.info("the workers serve %s with max_model_len %d (the gateway had %d)", model.name,
                 limit, model.max_model_len)
        model.max_model_len = limit

    async def first(self) -> None:
        """At start: the workers' limit, if a reachable router reports one soon."""
        deadline = time.monotonic() + FIRST_REPORT_WAIT_S
        while (known := await self.check()) is False and time.monotonic() < deadline:
            await asyncio.sleep(FIRST_REPORT_POLL_S)
        if not known:
            log.info("no worker limit from the router yet: max_model_len %d until one reports",
                     self.gateway.default_model.max_model_len)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

"""Runs an API request's n choices concurrently through the orchestrator, and turns their messages
into a streamed SSE body or the parts of a final response; meters tokens, SLOs and goodput when each
choice ends."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from opentelemetry import propagate, trace

from baton.services.common.convert import params_to_proto
from baton.services.common.openai_protocol import EngineInput, OpenAIRequest
from baton.services.common.openai_render import ChunkWriter, TokenText, sse
from baton.services.gateway.choices import ChoiceState
from baton.services.gateway.config import SLO, parse_slos
from baton.services.gateway.orchestrator import ChoiceProgress, ChoiceRequest, Refused
from baton.services.gateway.tenants import Tenant

if TYPE_CHECKING:
    from baton.services.gateway.app import Gateway

log = logging.getLogger(__name__)
tracer = trace.get_tracer("baton.gateway")
_END = object()


@dataclass
class ApiRequest:
    oai: OpenAIRequest
    inp: EngineInput
    tenant: Tenant
    response_id: str
    started: float  # time.monotonic() at arrival
    trace_headers: dict[str, str]


@dataclass
class Running:
    """A request whose choices are being served: their events arrive on one queue as (index, message
    | error)."""
    api: ApiRequest
    states: list[ChoiceState]
    events: asyncio.Queue
    tasks: list[asyncio.Task]
    span: trace.Span
    pending: list[tuple[int, object]] = field(default_factory=list)


class Serving:
    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway
        self.slos = parse_slos(gateway.config.slos)
        self.text_of = TokenText(gateway.tokenizer)

    def slo_for(self, priority: int) -> SLO | None:
        """The target of the nearest priority at or below this one (a higher class inherits a
        lower's)."""
        eligible = [p for p in self.slos if p <= priority]
        return self.slos[max(eligible)] if eligible else None

    async def start(self, api: ApiRequest) -> Running:
        """Starts every choice and waits for the first event, so a refusal is raised before any byte
        is sent."""
        span = tracer.start_span(
            "request", context=propagate.extract(api.trace_headers), attributes={
                "baton.request_id": api.response_id, "baton.tenant": api.tenant.name,
                "baton.prompt_tokens": len(api.inp.prompt_token_ids)
            })
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        logprobs = api.oai.logprobs_k()[1] is not None
        states = [ChoiceState(i, api.inp.prompt_token_ids, logprobs=[] if logprobs else None)
                  for i in range(api.inp.n)]
        events: asyncio.Queue = asyncio.Queue()
        tasks = [
            asyncio.ensure_future(self._run_choice(api, s, events, tuple(carrier.items())))
            for s in states
        ]
        running = Running(api, states, events, tasks, span)
        self.gateway.metrics.in_flight.inc()
        try:
            first = await events.get()
        except asyncio.CancelledError:  # the client left before the first event: so do the choices
            await self.finish(running)
            raise
        if isinstance(first[1], Refused):
            await self.finish(running)
            raise first[1]
        running.pending.append(first)
        return running

    async def finish(self, running: Running) -> None:
        for task in running.tasks:
            task.cancel()
        await asyncio.gather(*running.tasks, return_exceptions=True)
        running.span.end()
        self.gateway.metrics.in_flight.dec()

    async def _run_choice(self, api: ApiRequest, state: ChoiceState, events: asyncio.Queue,
                          metadata: tuple[tuple[str, str], ...]) -> None:
        inp = api.inp
        priority = api.tenant.priority + inp.priority
        salt = api.tenant.cache_salt or ""
        if inp.cache_salt:
            salt = f"{salt}|{inp.cache_salt}"
        slo = self.slo_for(priority)
        choice = ChoiceRequest(f"{api.response_id}-{state.index}", inp.prompt_token_ids,
                               params_to_proto(inp.params.for_choice(state.index)), api.tenant.name,
                               priority, salt, slo.ttft_ms if slo else None,
                               slo.tpot_ms if slo else None, metadata)
        progress = ChoiceProgress()
        try:
            async for message in self.gateway.orchestrator.run(choice, progress):
                events.put_nowait((state.index, message))
            events.put_nowait((state.index, _END))
        except Refused as e:
            # A refusal is an answer, counted by code (baton_gateway_rejections_total), not a
            # failure to log.
            log.debug("request %s: choice %d refused: %s", api.response_id, state.index, e.message)
            events.put_nowait((state.index, e))
        except grpc.aio.AioRpcError as e:
            log.warning("request %s: choice %d failed: %s", api.response_id, state.index,
                        e.details())
            events.put_nowait((state.index, e))
        finally:
            self._meter(api, state, progress, priority, slo)

    def _meter(self, api: ApiRequest, state: ChoiceState, progress: ChoiceProgress, priority: int,
               slo: SLO | None) -> None:
        metrics, tenant = self.gateway.metrics, api.tenant.name
        tokens = len(progress.tokens)
        ttft = (progress.first_token_at -
                api.started if progress.first_token_at is not None else None)
        if ttft is not None:
            metrics.ttft.observe(ttft)
        metrics.finish_choice(priority, slo if state.finish_reason else None, ttft,
                              time.monotonic() - api.started, tokens)
        metrics.migrations.inc(progress.migrations)
        metrics.completion_tokens.labels(tenant).inc(tokens)
        if state.index == 0:
            metrics.prompt_tokens.labels(tenant).inc(len(api.inp.prompt_token_ids))
        self.gateway.limiter.refund(tenant, api.inp.params.max_tokens - tokens)

    async def _events(self, running: Running) -> AsyncIterator[tuple[int, object]]:
        """(index, message | error) until every choice ended."""
        live = len(running.states)
        while live:
            index, item = running.pending.pop(0) if running.pending else await running.events.get()
            if item is _END or isinstance(item, Exception):
                live -= 1
            yield index, item

    async def stream(self, api: ApiRequest, running: Running) -> AsyncIterator[str]:
        writer = ChunkWriter(api.oai, api.response_id, self.gateway.model_name, self.text_of,
                             self.gateway.tool_parser)
        # per choice: n choices interleave, and ITL is a gap within one
        last_token_at: dict[int, float] = {}
        try:
            if writer.chat:
                for state in running.states:
                    yield writer.role(state.index)
            async for index, item in self._events(running):
                if isinstance(item, Exception):
                    yield sse(_error_event(item))
                    continue
                if item is _END:
                    continue
                state = running.states[index]
                new = state.add(item)
                if item.token_ids:
                    now = time.monotonic()
                    if index in last_token_at:
                        self.gateway.metrics.itl.observe(now - last_token_at[index])
                    last_token_at[index] = now
                yield writer.delta(state, new)
            options = api.oai.stream_options
            if options is not None and options.include_usage:
                yield writer.usage(running.states)
            yield sse("[DONE]")
        finally:
            await self.finish(running)

    async def collect(self, api: ApiRequest) -> list[ChoiceState]:
        running = await self.start(api)
        try:
            async for index, item in self._events(running):
                if isinstance(item, Refused):
                    raise item
                if isinstance(item, grpc.aio.AioRpcError):
                    raise Refused(503, f"a worker failed mid-request: {item.details()}",
                                  "worker_failed", 1.0)
                if item is not _END:
                    running.states[index].add(item)
            return running.states
        finally:
            await self.finish(running)


def _error_event(error: Exception) -> dict[str, object]:
    if isinstance(error, Refused):
        return {
            "error": {
                "message": error.message, "type": "server_error", "param": None, "code": error.code
            }
        }
    message = f"the stream broke and could not move to another worker: {error.details()}"
    return {
        "error": {
            "message": message, "type": "server_error", "param": None, "code": "worker_failed"
        }
    }

"""Runs an API request's n choices concurrently through the orchestrator, and turns their messages
into a streamed SSE body or the parts of a final response; meters tokens, SLOs and goodput when each
choice ends.

Every choice ends with exactly one last event (its end or its error), whatever it raised, so nothing
waits on a choice forever; and a request ends (choices cancelled, in-flight count down) however its
client left, the stream's response owning it from start to end."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from opentelemetry import propagate, trace
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from baton.services.gateway.choices import ChoiceState
from baton.services.gateway.config import SLO, parse_slos
from baton.services.gateway.orchestrator import ChoiceProgress, ChoiceRequest, Refused
from baton.services.gateway.rate_limits.limiter import Reservation
from baton.services.gateway.served_model import ServedModel
from baton.services.gateway.state import Gateway
from baton.services.gateway.tenants import Tenant
from baton.services.gateway.usage_meter import UsageTicket
from baton.services.openai.endpoints import OpenAIRequest
from baton.services.openai.engine_input import EngineInput
from baton.services.openai.render import TokenText
from baton.services.openai.streaming import EventWriter, sse

log = logging.getLogger(__name__)
tracer = trace.get_tracer("baton.gateway")
_END = object()


@dataclass
class ApiRequest:
    oai: OpenAIRequest
    inp: EngineInput
    tenant: Tenant
    priority: int  # the tenant's, moved by the request's within its band; higher is served first
    response_id: str
    started: float  # time.monotonic() at arrival
    trace_headers: dict[str, str]
    reservation: Reservation
    served: ServedModel  # the base model it runs on: its tokenizer, template and workers
    # set once its choices start: from then on the end of the last one settles the reservation
    launched: bool = False
    completion_tokens: int = 0  # the choices' outputs so far, summed when each ends
    lora_name: str | None = None  # the LoRA adapter `model` named; None: the base model
    endpoint: str = ""  # its path, for the usage record
    key_id: str | None = None  # the API key's id (tenants.key_id), for the usage record
    usage: UsageTicket | None = None  # its usage record, from its start
    failed: bool = False  # a choice ended in an error

    def model_name(self) -> str:
        """The name its answers carry: the adapter's, as vLLM answers a request to an adapter,
        else its base model's."""
        return self.lora_name or self.served.name


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
    # set once the choices are cancelled: done when they have all unwound
    ended: asyncio.Future | None = None
    rejected: bool = False  # refused before its first token

    def outcome(self) -> str:
        """The status of its usage record."""
        if self.rejected:
            return "rejected"
        if self.api.failed:
            return "failed"
        return "completed" if all(s.finish_reason for s in self.states) else "cancelled"


class StreamedResponse(StreamingResponse):
    """The SSE response of a running request, which ends the request however the response ends:
    streamed to the end, or cut by the client before or during the stream. Starlette cancels the
    body on a disconnect and may never start it, so the body's own cleanup cannot be relied on."""

    def __init__(self, serving: Serving, running: Running, writer: EventWriter) -> None:
        super().__init__(serving.stream(running, writer), media_type="text/event-stream")
        self.serving, self.running = serving, running

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.serving.end(self.running)


class Serving:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.slos = parse_slos(gateway.config.slos)
        # per checkpoint folder and naming (text, or ids): each caches its tokens' texts
        self._token_texts: dict[tuple[str, bool], TokenText] = {}

    def token_text(self, api: ApiRequest) -> TokenText:
        """How the request's logprobs name tokens of its model: text, or "token_id:N"."""
        as_ids = bool(api.oai.return_tokens_as_token_ids)
        key = (api.served.path, as_ids)
        if key not in self._token_texts:
            self._token_texts[key] = TokenText(api.served.tokenizer, as_ids=as_ids)
        return self._token_texts[key]

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
                "baton.prompt_tokens": api.inp.prompt_tokens
            })
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        logprobs = api.oai.logprobs_k()[1] is not None
        states = [ChoiceState(i, api.inp.prompt_of(i), logprobs=[] if logprobs else None)
                  for i in range(api.inp.choices)]
        events: asyncio.Queue = asyncio.Queue()
        tasks = [
            asyncio.ensure_future(self._run_choice(api, s, events, tuple(carrier.items())))
            for s in states
        ]
        running = Running(api, states, events, tasks, span)
        api.launched = True
        meter = self.gateway.meter
        if meter is not None:
            api.usage = meter.open(api.response_id, api.tenant.name, api.key_id, api.endpoint,
                                   api.served.name, api.inp.prompt_tokens, states)
        self.gateway.metrics.in_flight.inc()
        try:
            first = await events.get()
        except BaseException:  # the caller was cancelled (its client left): nobody will finish it
            self.end(running)
            raise
        if isinstance(first[1], Refused):
            running.rejected = True
            await self.finish(running)
            raise first[1]
        running.pending.append(first)
        return running

    def end(self, running: Running) -> asyncio.Future:
        """Cancels the request's choices (they release their leases and abort their worker requests
        as they unwind) and counts the request out once they have. Synchronous, so that a caller
        being cancelled (anyio's cancel scope cancels every await of a cut stream's body) cannot
        skip it; a second call does nothing more."""
        if running.ended is None:
            for task in running.tasks:
                task.cancel()
            running.ended = asyncio.gather(*running.tasks, return_exceptions=True)
            running.ended.add_done_callback(lambda _: self._ended(running))
        return running.ended

    def _ended(self, running: Running) -> None:
        api = running.api
        # every choice has ended, however (finished, failed, cancelled by a client that left) and
        # metered its tokens: the request is charged what it used, no more
        api.reservation.settle(api.inp.prompt_tokens + api.completion_tokens)
        running.span.end()
        self.gateway.metrics.in_flight.dec()
        # the usage line a tenant's billing reads: who it was for, and what they attached
        log.info("request %s usage: tenant %s, end user %s, %d prompt tokens, %d completion "
                 "tokens, metadata %s", api.response_id, api.tenant.name, api.oai.end_user(),
                 api.inp.prompt_tokens, sum(len(s.token_ids) for s in running.states),
                 json.dumps(api.oai.metadata) if api.oai.metadata else "none")
        meter, ticket = self.gateway.meter, running.api.usage
        if meter is not None and ticket is not None:
            meter.settle(ticket, running.outcome())

    async def finish(self, running: Running) -> None:
        """Ends the request and waits until its choices have unwound (metered, leases released)."""
        await asyncio.shield(self.end(running))

    def _choice(self, api: ApiRequest, state: ChoiceState, slo: SLO | None,
                metadata: tuple[tuple[str, str], ...]) -> ChoiceRequest:
        inp = api.inp
        salt = api.tenant.cache_salt or ""
        if inp.cache_salt:
            salt = f"{salt}|{inp.cache_salt}"
        return ChoiceRequest(f"{api.response_id}-{state.index}", state.prompt_token_ids,
                             inp.params.for_choice(state.index), api.tenant.name,
                             api.priority, salt, slo.ttft_ms if slo else None,
                             slo.tpot_ms if slo else None, metadata,
                             api.oai.prompt_cache_key or "", api.lora_name, api.served.name)

    async def _run_choice(self, api: ApiRequest, state: ChoiceState, events: asyncio.Queue,
                          metadata: tuple[tuple[str, str], ...]) -> None:
        slo = self.slo_for(api.priority)
        progress = ChoiceProgress()
        last: object = _END
        try:
            choice = self._choice(api, state, slo, metadata)
            async for message in self.gateway.orchestrator.run(choice, progress):
                events.put_nowait((state.index, message))
        except Refused as e:
            # A refusal is an answer, counted by code (baton_gateway_rejections_total), not a
            # failure to log.
            log.debug("request %s: choice %d refused: %s", api.response_id, state.index, e.message)
            last = e
        except grpc.aio.AioRpcError as e:
            log.warning("request %s: choice %d failed: %s", api.response_id, state.index,
                        e.details())
            last = e
        except Exception as e:
            log.exception("request %s: choice %d failed unexpectedly", api.response_id,
                          state.index)
            last = Refused(500, f"internal error: {type(e).__name__}", "internal_error")
        finally:
            # also when cancelled, so the one reading the events is never left waiting
            events.put_nowait((state.index, last))
            if last is not _END:
                api.failed = True
            self._meter(api, state, progress, slo)

    def _meter(self, api: ApiRequest, state: ChoiceState, progress: ChoiceProgress,
               slo: SLO | None) -> None:
        metrics, tenant = self.gateway.metrics, api.tenant.name
        label = metrics.tenant(tenant)
        tokens = len(progress.tokens)
        ttft = (progress.first_token_at -
                api.started if progress.first_token_at is not None else None)
        if ttft is not None:
            metrics.ttft.observe(ttft)
            if api.usage is not None:
                api.usage.saw_ttft(ttft)
        metrics.finish_choice(api.priority, slo if state.finish_reason else None, ttft,
                              time.monotonic() - api.started, tokens)
        metrics.migrations.inc(progress.migrations)
        metrics.completion_tokens.labels(label).inc(tokens)
        if state.index % api.inp.n == 0:  # each prompt once, whatever n
            metrics.prompt_tokens.labels(label).inc(len(state.prompt_token_ids))
        api.completion_tokens += tokens

    async def _events(self, running: Running) -> AsyncIterator[tuple[int, object]]:
        """(index, message | error) until every choice ended."""
        live = len(running.states)
        while live:
            index, item = running.pending.pop(0) if running.pending else await running.events.get()
            if item is _END or isinstance(item, Exception):
                live -= 1
            yield index, item

    async def stream(self, running: Running, writer: EventWriter) -> AsyncIterator[str]:
        """The SSE body, in the endpoint's chunks (`writer`); error events where a choice failed."""
        # per choice: n choices interleave, and ITL is a gap within one
        last_token_at: dict[int, float] = {}
        try:
            for chunk in writer.opening(running.states):
                yield chunk
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
            for chunk in writer.closing(running.states):
                yield chunk
        finally:
            await self.finish(running)

    async def collect(self, api: ApiRequest) -> list[ChoiceState]:
        running = await self.start(api)
        try:
            async for index, item in self._events(running):
                if isinstance(item, Refused):
                    raise item
                if isinstance(item, grpc.aio.AioRpcError):  # logged by _run_choice
                    raise Refused(503, "a worker failed mid-request", "worker_failed", 1.0)
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
    # The gRPC details name internal addresses; _run_choice logged them with the request id.
    message = "the stream broke and could not move to another worker"
    return {
        "error": {
            "message": message, "type": "server_error", "param": None, "code": "worker_failed"
        }
    }

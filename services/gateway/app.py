"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions,
/health, /ready, /metrics and /openapi.json. Each request is authenticated, rate-limited, tokenized,
and its n choices are served through the orchestrator (router placement, prefill, hand-off,
decode)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from transformers import PreTrainedTokenizerBase

from baton.services.common.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   ProtocolError, new_response_id, parse_request,
                                                   to_engine_input)
from baton.services.common.openai_render import build_response
from baton.services.common.tool_parsers import ToolParser
from baton.services.gateway.body import parse_json, read_body
from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.errors import (CLIENT_CLOSED, error_response, install_handlers,
                                          protocol_error_response)
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.ops_auth import KeyRequired
from baton.services.gateway.orchestrator import Orchestrator, Refused
from baton.services.gateway.rate_limits import RateLimited, RateLimiter
from baton.services.gateway.readiness import RouterHealth
from baton.services.gateway.serving import ApiRequest, Serving, StreamedResponse
from baton.services.gateway.tenants import DEFAULT_TENANT, AuthError, KeyStore, Tenant

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Gateway:
    config: GatewayConfig
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    max_model_len: int
    orchestrator: Orchestrator
    keys: KeyStore | None
    metrics: GatewayMetrics
    registry: CollectorRegistry
    limiter: RateLimiter
    # the model family's tool-call format, for auto tool_choice
    tool_parser: ToolParser | None = None
    draining: bool = False
    vocab_size: int | None = None  # the model's: logit_bias ids must fall in it
    router_health: RouterHealth | None = None
    # renders chat templates and tokenizes, so a long prompt does not stall the event loop
    tokenize_pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.tokenize_pool = ThreadPoolExecutor(self.config.tokenizer_threads,
                                                thread_name_prefix="tokenize")

    def default_tenant(self) -> Tenant:
        config = self.config
        return Tenant(DEFAULT_TENANT, requests_per_minute=config.default_requests_per_minute,
                      tokens_per_minute=config.default_tokens_per_minute,
                      min_priority=config.default_min_priority,
                      max_priority=config.default_max_priority)

    def not_ready(self) -> str | None:
        """Why /ready answers 503, or None when ready."""
        if self.draining:
            return "gateway is draining"
        return self.router_health.problem if self.router_health is not None else None


def _schema(model: type) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}}
        }
    }


# A completion answers with JSON, or with server-sent events when the request streams.
_BODIES: dict[int | str,
              dict[str,
                   Any]] = {200: {"content": {"application/json": {}, "text/event-stream": {}}}}


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Baton gateway", description="OpenAI-compatible API for Baton")
    install_handlers(app)
    if gateway.keys is not None:
        app.add_middleware(KeyRequired, keys=gateway.keys)
    serving = Serving(gateway)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list", "data": [{
                "id": gateway.model_name, "object": "model", "created": 0, "owned_by": "baton",
                "max_model_len": gateway.max_model_len
            }]
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        problem = gateway.not_ready()
        if problem is not None:
            return error_response(503, problem, "service_unavailable")
        return JSONResponse({"status": "ready"})

    if gateway.config.metrics_port is None:  # otherwise served there only
        @app.get("/metrics", response_class=PlainTextResponse)  # documented as text, not JSON
        async def metrics() -> Response:
            return Response(generate_latest(gateway.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", openapi_extra=_schema(CompletionRequest), responses=_BODIES)
    async def completions(request: Request) -> Response:
        return await _serve(gateway, serving, request, "/v1/completions")

    @app.post("/v1/chat/completions", openapi_extra=_schema(ChatCompletionRequest),
              responses=_BODIES)
    async def chat_completions(request: Request) -> Response:
        return await _serve(gateway, serving, request, "/v1/chat/completions")

    return app


async def _serve(gateway: Gateway, serving: Serving, request: Request, url: str) -> Response:
    started = time.monotonic()
    try:
        response = await _handle(gateway, serving, request, url, started)
    except ProtocolError as e:
        response = protocol_error_response(e)
    except AuthError as e:
        response = error_response(401, str(e), "invalid_api_key")
    except RateLimited as e:
        gateway.metrics.rejections.labels("rate_limit").inc()
        response = error_response(429, str(e), "rate_limit_exceeded", retry_after_s=e.retry_after_s)
    except Refused as e:
        gateway.metrics.rejections.labels(e.code).inc()
        response = error_response(e.status, e.message, e.code, retry_after_s=e.retry_after_s)
    gateway.metrics.requests.labels(url, str(response.status_code)).inc()
    return response


async def _handle(gateway: Gateway, serving: Serving, request: Request, url: str,
                  started: float) -> Response:
    config = gateway.config
    # the key first: nobody without one gets the body read and parsed
    tenant = gateway.keys.tenant_for(request.headers.get("authorization")) if gateway.keys else \
        gateway.default_tenant()
    raw = await read_body(request, config.max_request_body_bytes)
    oai = parse_request(url, parse_json(raw, config.max_json_depth))
    if oai.model is not None and oai.model != gateway.model_name:
        return error_response(404, f"The model `{oai.model}` does not exist; this server serves "
                                   f"`{gateway.model_name}`", "model_not_found", param="model")
    priority = tenant.priority_for(oai.priority, config.max_request_priority)
    inp = await asyncio.get_running_loop().run_in_executor(
        gateway.tokenize_pool,
        partial(to_engine_input, oai, gateway.tokenizer, gateway.max_model_len,
                config.max_logprobs, gateway.vocab_size))
    gateway.limiter.admit(tenant.name, tenant.requests_per_minute, tenant.tokens_per_minute,
                          len(inp.prompt_token_ids) + inp.params.max_tokens * inp.n)
    api = ApiRequest(oai, inp, tenant, priority, new_response_id(oai), started,
                     _trace_headers(request))
    log.debug("request %s: %d prompt tokens, n=%d, tenant %s, priority %d", api.response_id,
              len(inp.prompt_token_ids), inp.n, tenant.name, priority)
    if oai.stream:
        # Placement errors become HTTP statuses before the stream opens; a client that leaves
        # before the first token (a long prefill, a queue) takes the request with it.
        first = await _unless_disconnected(request, api, serving.start(api))
        if first is None:
            return Response(status_code=CLIENT_CLOSED)
        return StreamedResponse(serving, api, first)
    body = await _collect(serving, api, request)
    # 499 (nginx's "client closed request"): nobody reads it, but the requests counter shows it
    return JSONResponse(body) if body is not None else Response(status_code=CLIENT_CLOSED)


async def _unless_disconnected(request: Request, api: ApiRequest,
                               work: Awaitable[T]) -> T | None:
    """Awaits work; cancels it and returns None if the client goes away first."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            log.info("request %s: client disconnected; aborted", api.response_id)
            return None
    return task.result()


async def _collect(serving: Serving, api: ApiRequest, request: Request) -> dict[str, Any] | None:
    """Runs a non-streamed request; abandons it and returns None if the client goes away first."""
    states = await _unless_disconnected(request, api, serving.collect(api))
    if states is None:
        return None
    gateway = serving.gateway
    return build_response(api.oai, states, gateway.tokenizer, gateway.model_name, api.response_id,
                          gateway.tool_parser)


def _trace_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}

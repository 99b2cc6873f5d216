"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions,
/health, /ready, /metrics and /openapi.json. Each request is authenticated, rate-limited, tokenized,
and its n choices are served through the orchestrator (router placement, prefill, hand-off,
decode)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from transformers import PreTrainedTokenizerBase

from baton.services.common.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   ProtocolError, new_response_id, parse_request,
                                                   to_engine_input)
from baton.services.common.openai_render import build_response
from baton.services.common.tool_parsers import ToolParser
from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.errors import error_response, install_handlers, protocol_error_response
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.orchestrator import Orchestrator, Refused
from baton.services.gateway.rate_limits import RateLimited, RateLimiter
from baton.services.gateway.serving import ApiRequest, Serving
from baton.services.gateway.tenants import DEFAULT_TENANT, AuthError, KeyStore, Tenant

log = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_CLOSED = 499


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

    def default_tenant(self) -> Tenant:
        return Tenant(DEFAULT_TENANT, requests_per_minute=self.config.default_requests_per_minute,
                      tokens_per_minute=self.config.default_tokens_per_minute)


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
        if gateway.draining:
            return error_response(503, "gateway is draining", "service_unavailable")
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", response_class=PlainTextResponse)  # documented as the text it is, not JSON
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


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"the request body is not valid UTF-8: {e}",
                            code="invalid_encoding") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"the request body is not valid JSON: {e}",
                            code="invalid_json") from None


async def _handle(gateway: Gateway, serving: Serving, request: Request, url: str,
                  started: float) -> Response:
    body = await _read_json(request)
    tenant = gateway.keys.tenant_for(request.headers.get("authorization")) if gateway.keys else \
        gateway.default_tenant()
    oai = parse_request(url, body)
    if oai.model is not None and oai.model != gateway.model_name:
        return error_response(404, f"The model `{oai.model}` does not exist; this server serves "
                                   f"`{gateway.model_name}`", "model_not_found", param="model")
    inp = to_engine_input(oai, gateway.tokenizer, gateway.max_model_len,
                          gateway.config.max_logprobs, gateway.vocab_size)
    gateway.limiter.admit(tenant.name, tenant.requests_per_minute, tenant.tokens_per_minute,
                          len(inp.prompt_token_ids) + inp.params.max_tokens * inp.n)
    api = ApiRequest(oai, inp, tenant, new_response_id(oai), started, _trace_headers(request))
    log.debug("request %s: %d prompt tokens, n=%d, tenant %s", api.response_id,
              len(inp.prompt_token_ids), inp.n, tenant.name)
    if oai.stream:
        # Placement errors become HTTP statuses before the stream opens; a client that leaves
        # before the first token (a long prefill, a queue) takes the request with it.
        first = await _unless_disconnected(request, api, serving.start(api))
        if first is None:
            return Response(status_code=CLIENT_CLOSED)
        return StreamingResponse(serving.stream(api, first), media_type="text/event-stream")
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

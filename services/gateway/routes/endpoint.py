"""What every generating endpoint does with a request, in order: authenticate, read and parse the
body, tokenize, rate-limit, serve its n choices through the orchestrator, then answer with one body
or a stream written by the endpoint's own chunk writer. Every failure becomes OpenAI error JSON
with its status."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from baton.services.gateway.body import parse_json, read_body
from baton.services.gateway.errors import CLIENT_CLOSED, error_response, protocol_error_response
from baton.services.gateway.orchestrator import Refused
from baton.services.gateway.rate_limits.store import RateLimited
from baton.services.gateway.routes.json_route import unknown_model
from baton.services.gateway.serving import ApiRequest, Serving, StreamedResponse
from baton.services.gateway.state import Gateway
from baton.services.gateway.tenants import AuthError, Tenant, key_id
from baton.services.openai.common import BaseRequest
from baton.services.openai.endpoints import OpenAIRequest, new_response_id, parse_request
from baton.services.openai.engine_input import EngineInput, to_engine_input
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import build_response
from baton.services.openai.streaming import ChunkWriter
from baton.services.state.urls import StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
# A completion answers with JSON, or with server-sent events when the request streams.
BODIES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}}}


@dataclass(frozen=True)
class Endpoint:
    """A generating endpoint: its path, its request model, and the chunk writer of its streams."""
    url: str
    model: type[BaseRequest]
    writer: Callable[[Serving, ApiRequest], ChunkWriter]

    def openapi_extra(self) -> dict[str, Any]:
        """The request body's schema, for /openapi.json (the route reads the raw body itself)."""
        return {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": self.model.model_json_schema()}}
            }
        }


async def serve_endpoint(serving: Serving, endpoint: Endpoint, request: Request) -> Response:
    return await answer(serving.gateway, endpoint.url,
                        _handle(serving, endpoint, request, time.monotonic()))


async def answer(gateway: Gateway, url: str, work: Awaitable[Response]) -> Response:
    """The response `work` makes, or the error response for what it raised; counted by status."""
    try:
        response = await work
    except ProtocolError as e:
        response = protocol_error_response(e)
    except AuthError as e:
        response = error_response(401, str(e), "invalid_api_key")
    except RateLimited as e:
        gateway.metrics.rejections.labels(
            "rate_limit" if e.status == 429 else "rate_limit_store_unavailable").inc()
        response = error_response(e.status, str(e), e.code, retry_after_s=e.retry_after_s)
    except Refused as e:
        gateway.metrics.rejections.labels(e.code).inc()
        response = error_response(e.status, e.message, e.code, retry_after_s=e.retry_after_s)
    except StoreUnavailable as e:
        gateway.metrics.state_store_failures.labels("responses").inc()
        response = error_response(503, f"{e}; retry later, or send store: false",
                                  "state_store_unavailable", retry_after_s=1.0)
    gateway.metrics.requests.labels(url, str(response.status_code)).inc()
    return response


def authenticate(gateway: Gateway, request: Request) -> tuple[Tenant, str | None]:
    """The caller's tenant and its key's id; AuthError (401) without a valid key."""
    authorization = request.headers.get("authorization")
    if gateway.keys is None:
        return gateway.default_tenant(), key_id(authorization)
    return gateway.keys.tenant_for(authorization), key_id(authorization)


async def read_json(gateway: Gateway, request: Request) -> Any:
    raw = await read_body(request, gateway.config.max_request_body_bytes)
    return parse_json(raw, gateway.config.max_json_depth)


async def admit(serving: Serving, oai: OpenAIRequest, caller: tuple[Tenant, str | None],
                request: Request, started: float, endpoint: str,
                response_id: str | None = None) -> ApiRequest:
    """Tokenizes the request and passes it through its tenant's rate limits."""
    gateway, (tenant, key) = serving.gateway, caller
    config = gateway.config
    # the base model it runs on (its tokenizer, its limit) and the adapter it names, if any
    served, lora_name = gateway.resolve(oai.model)
    priority = tenant.priority_for(oai.priority, config.max_request_priority)
    inp = await asyncio.get_running_loop().run_in_executor(
        gateway.tokenize_pool,
        partial(to_engine_input, oai, served.tokenizer, served.max_model_len,
                config.max_logprobs, served.vocab_size))
    reservation = await gateway.limiter.admit(
        tenant.name, tenant.requests_per_minute, tenant.tokens_per_minute,
        _reserved_tokens(oai, inp, config.rate_limit_output_estimate))
    return ApiRequest(oai, inp, tenant, priority, response_id or new_response_id(oai), started,
                      _trace_headers(request), reservation, served, lora_name=lora_name,
                      endpoint=endpoint, key_id=key)


def settle_unless_launched(api: ApiRequest) -> None:
    """Settles the reservation of a request that never reached the orchestrator (cancelled or
    refused first): no choice's end will."""
    if not api.launched:
        api.reservation.settle(api.inp.prompt_tokens)


async def _handle(serving: Serving, endpoint: Endpoint, request: Request,
                  started: float) -> Response:
    # the key first: nobody without one gets the body read and parsed
    gateway = serving.gateway
    config = gateway.config
    caller = authenticate(gateway, request)
    oai = parse_request(endpoint.url, await read_json(gateway, request),
                        config.strict_request_fields)
    if oai.ignored_fields:
        log.warning("%s: the request's fields %s are not defined by this API and were ignored",
                    endpoint.url, ", ".join(sorted(oai.ignored_fields)))
    if oai.return_tokens_as_token_ids is None:
        oai.return_tokens_as_token_ids = config.return_tokens_as_token_ids
    refusal = unknown_model(gateway, oai.model)
    if refusal is not None:
        return refusal
    api = await admit(serving, oai, caller, request, started, endpoint.url)
    tenant, inp, priority = api.tenant, api.inp, api.priority
    log.debug("request %s: %d prompt tokens, %d choices, tenant %s, end user %s, priority %d",
              api.response_id, inp.prompt_tokens, inp.choices, tenant.name, oai.end_user(),
              priority)
    try:
        return await _serve(serving, endpoint, request, api)
    finally:
        settle_unless_launched(api)


def _reserved_tokens(oai: BaseRequest, inp: EngineInput, estimate: int) -> int:
    """The prompt plus the most each choice may produce: max_tokens, or when the request sets
    none, `estimate` (what it produces beyond it is charged when it ends)."""
    per_choice = inp.params.max_tokens
    if oai.requested_max_tokens()[1] is None:
        per_choice = min(per_choice, estimate)
    return inp.prompt_tokens + per_choice * inp.choices


async def _serve(serving: Serving, endpoint: Endpoint, request: Request,
                 api: ApiRequest) -> Response:
    if api.oai.stream:
        # Placement errors become HTTP statuses before the stream opens; a client that leaves
        # before the first token (a long prefill, a queue) takes the request with it.
        first = await unless_disconnected(request, api, serving.start(api))
        if first is None:
            return Response(status_code=CLIENT_CLOSED)
        return StreamedResponse(serving, first, endpoint.writer(serving, api))
    body = await _collect(serving, api, request)
    # 499 (nginx's "client closed request"): nobody reads it, but the requests counter shows it
    return JSONResponse(body) if body is not None else Response(status_code=CLIENT_CLOSED)


async def unless_disconnected(request: Request, api: ApiRequest,
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
    states = await unless_disconnected(request, api, serving.collect(api))
    if states is None:
        return None
    return build_response(api.oai, states, api.served.tokenizer, api.model_name(),
                          api.response_id, api.served.tool_parser)


def _trace_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}

"""POST /invocations, SageMaker's one inference route (vLLM serves it): the body's shape picks the
endpoint (services/openai/invocations.py:invocation_url), which then serves it as its own route
would, from authentication on."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import TypeAdapter
from starlette.types import Message

from baton.services.gateway.errors import protocol_error_response
from baton.services.gateway.routes.chat import CHAT_COMPLETIONS
from baton.services.gateway.routes.completions import COMPLETIONS
from baton.services.gateway.routes.endpoint import BODIES, serve_endpoint
from baton.services.gateway.routes.json_route import read_json
from baton.services.gateway.serving import Serving
from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.completions import CompletionRequest
from baton.services.openai.errors import ProtocolError
from baton.services.openai.invocations import invocation_url

URL = "/invocations"
ENDPOINTS = {e.url: e for e in (CHAT_COMPLETIONS, COMPLETIONS)}
SCHEMA = TypeAdapter(ChatCompletionRequest | CompletionRequest).json_schema()


def replayed(request: Request, raw: bytes) -> Request:
    """The request as if unread: its body (already read here) comes first, then what the client
    sends next (a disconnect), so the endpoint reads and watches it as its own."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)


def routes(serving: Serving) -> APIRouter:
    router = APIRouter()
    gateway = serving.gateway

    @router.post(URL, responses=BODIES, openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": SCHEMA}}}})
    async def invocations(request: Request) -> Response:
        # With auth on, ops_auth's middleware has checked the key before the body is read.
        try:
            raw, body = await read_json(gateway, request)
            endpoint = ENDPOINTS[invocation_url(body)]
        except ProtocolError as e:
            response = protocol_error_response(e)
            gateway.metrics.requests.labels(URL, str(response.status_code)).inc()
            return response
        return await serve_endpoint(serving, endpoint, replayed(request, raw))

    return router

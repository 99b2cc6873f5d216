"""What the gateway's JSON routes besides the generating ones share (/tokenize, /detokenize,
/invocations): the body read within the same limits as a completion's, the request body's schema
for /openapi.json (the routes read the raw body themselves, so OpenAI-shaped errors replace
FastAPI's 422), and every refusal as OpenAI error JSON, counted like the generating endpoints'."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Union

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, TypeAdapter

from baton.services.gateway.body import parse_json, read_body
from baton.services.gateway.errors import protocol_error_response
from baton.services.gateway.state import Gateway
from baton.services.openai.errors import ProtocolError

T = TypeVar("T")


def request_body(*models: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra documenting a JSON body that is one of `models`."""
    schema = TypeAdapter(Union[models]).json_schema()  # Union of one model is that model
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def read_json(gateway: Gateway, request: Request) -> tuple[bytes, Any]:
    """The raw body and its JSON; ProtocolError for a body too large, too deep, or not JSON."""
    config = gateway.config
    raw = await read_body(request, config.max_request_body_bytes)
    return raw, parse_json(raw, config.max_json_depth)


def unknown_model(gateway: Gateway, model: str | None) -> Response | None:
    """The 404 for a request naming a model this gateway does not serve, neither one of its base
    models nor one of the LoRA adapters their workers serve (None: it may go on)."""
    try:
        gateway.resolve(model)
    except ProtocolError as e:
        return protocol_error_response(e)
    return None


async def in_pool(gateway: Gateway, work: Callable[[], T]) -> T:
    """Tokenizer work off the event loop (a long prompt would stall every other request)."""
    return await asyncio.get_running_loop().run_in_executor(gateway.tokenize_pool, work)


async def answer(gateway: Gateway, url: str, request: Request,
                 work: Callable[[Any], Awaitable[dict[str, Any] | Response]]) -> Response:
    """Reads the JSON body, hands it to `work`, and answers what it returns (a dict as JSON) or
    the OpenAI error of the ProtocolError it raises."""
    try:
        result = await work((await read_json(gateway, request))[1])
        response = result if isinstance(result, Response) else JSONResponse(result)
    except ProtocolError as e:
        response = protocol_error_response(e)
    gateway.metrics.requests.labels(url, str(response.status_code)).inc()
    return response

"""The Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel and GET /v1/responses/{id}/input_items (served by
services/gateway/responses_api.py)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from baton.services.gateway.responses_api import URL, ResponsesService, not_found
from baton.services.gateway.routes.endpoint import BODIES, answer, authenticate
from baton.services.gateway.serving import Serving
from baton.services.openai.errors import ProtocolError
from baton.services.openai.responses import ResponsesRequest
from baton.services.state.responses_repo import delete_response, get_response

ONE = URL + "/{response_id}"


def _page(items: list[dict], query: dict[str, str]) -> dict:
    """A page of input items: `order` (asc or desc, the default), `after` (an item id), `limit`
    (1-100, default 20)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ProtocolError("order must be asc or desc", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ProtocolError("limit must be an integer from 1 to 100", param="limit")
    ordered = items if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ProtocolError(f"no input item with id '{after}'", param="after")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}


def routes(serving: Serving) -> APIRouter:
    router = APIRouter()
    service = ResponsesService(serving)
    gateway = serving.gateway
    schema = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": ResponsesRequest.model_json_schema()}}}}

    @router.post(URL, openapi_extra=schema, responses=BODIES)
    async def create_response(request: Request) -> Response:
        return await answer(gateway, URL, service.create(request, time.monotonic()))

    @router.get(ONE)
    async def retrieve_response(response_id: str, request: Request) -> Response:
        return await answer(gateway, ONE, service.get(request, response_id))

    @router.post(ONE + "/cancel")
    async def cancel_response(response_id: str, request: Request) -> Response:
        return await answer(gateway, ONE + "/cancel", service.cancel(request, response_id))

    async def delete(request: Request, response_id: str) -> Response:
        tenant = authenticate(gateway, request)[0].name
        if not await delete_response(service.store, tenant, response_id):
            return not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @router.delete(ONE)
    async def delete_stored_response(response_id: str, request: Request) -> Response:
        return await answer(gateway, ONE, delete(request, response_id))

    async def input_items(request: Request, response_id: str) -> Response:
        tenant = authenticate(gateway, request)[0].name
        stored = await get_response(service.store, tenant, response_id)
        if stored is None:
            return not_found(response_id)
        return JSONResponse(_page(stored.input_items, dict(request.query_params)))

    @router.get(ONE + "/input_items")
    async def list_input_items(response_id: str, request: Request) -> Response:
        return await answer(gateway, ONE + "/input_items", input_items(request, response_id))

    return router

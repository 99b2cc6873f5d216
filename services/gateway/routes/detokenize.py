"""POST /detokenize (vLLM's): token ids back to text."""
from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from baton.services.gateway.routes.json_route import answer, in_pool, request_body, unknown_model
from baton.services.gateway.state import Gateway
from baton.services.openai.tokenize import (DetokenizeRequest, DetokenizeResponse, detokenize,
                                            detokenize_request)

URL = "/detokenize"


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    async def work(body: Any) -> dict[str, Any] | Response:
        # the model first: token ids are checked against its own tokenizer's vocabulary
        named = body.get("model") if isinstance(body, dict) else None
        named = named if isinstance(named, str) else None
        refused = unknown_model(gateway, named)
        if refused is not None:
            return refused
        served = gateway.resolve(named)[0]
        parsed = detokenize_request(body, len(served.tokenizer))
        return await in_pool(gateway, partial(detokenize, parsed, served.tokenizer))

    @router.post(URL, response_model=DetokenizeResponse,
                 openapi_extra=request_body(DetokenizeRequest))
    async def detokenize_route(request: Request) -> Response:
        return await answer(gateway, URL, request, work)

    return router

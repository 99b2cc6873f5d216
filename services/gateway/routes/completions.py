"""POST /v1/completions."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from baton.services.gateway.routes.endpoint import BODIES, Endpoint, serve_endpoint
from baton.services.gateway.serving import ApiRequest, Serving
from baton.services.openai.completions import CompletionRequest
from baton.services.openai.streaming import ChunkWriter, CompletionChunkWriter


def _writer(serving: Serving, api: ApiRequest) -> ChunkWriter:
    assert isinstance(api.oai, CompletionRequest)  # parsed by this endpoint's model
    return CompletionChunkWriter(api.oai, api.response_id, api.model_name(),
                                 serving.token_text(api))


COMPLETIONS = Endpoint("/v1/completions", CompletionRequest, _writer)


def routes(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.post(COMPLETIONS.url, openapi_extra=COMPLETIONS.openapi_extra(), responses=BODIES)
    async def completions(request: Request) -> Response:
        return await serve_endpoint(serving, COMPLETIONS, request)

    return router

"""POST /v1/chat/completions."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from baton.services.gateway.routes.endpoint import BODIES, Endpoint, serve_endpoint
from baton.services.gateway.serving import ApiRequest, Serving
from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.streaming import ChatChunkWriter, ChunkWriter


def _writer(serving: Serving, api: ApiRequest) -> ChunkWriter:
    assert isinstance(api.oai, ChatCompletionRequest)  # parsed by this endpoint's model
    return ChatChunkWriter(api.oai, api.response_id, api.model_name(), serving.token_text(api),
                           api.served.tool_parser)


CHAT_COMPLETIONS = Endpoint("/v1/chat/completions", ChatCompletionRequest, _writer)


def routes(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.post(CHAT_COMPLETIONS.url, openapi_extra=CHAT_COMPLETIONS.openapi_extra(),
                 responses=BODIES)
    async def chat_completions(request: Request) -> Response:
        return await serve_endpoint(serving, CHAT_COMPLETIONS, request)

    return router

"""POST /tokenize (vLLM's): a prompt or chat messages as the model's token ids, their count and
the context limit; messages rendered as /v1/chat/completions renders them."""
from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from baton.services.gateway.routes.json_route import answer, in_pool, request_body, unknown_model
from baton.services.gateway.state import Gateway
from baton.services.openai.tokenize import (TokenizeChatRequest, TokenizeCompletionRequest,
                                            TokenizeResponse, tokenize, tokenize_request)

URL = "/tokenize"


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    async def work(body: Any) -> dict[str, Any] | Response:
        options, chat = tokenize_request(body)
        refused = unknown_model(gateway, options.model)
        if refused is not None:
            return refused
        served = gateway.resolve(options.model)[0]  # its own tokenizer and chat template
        # the chat template renders in the pool: a long conversation would stall the event loop
        return await in_pool(gateway, partial(tokenize, options, chat, served.tokenizer,
                                              served.max_model_len))

    @router.post(URL, response_model=TokenizeResponse,
                 openapi_extra=request_body(TokenizeCompletionRequest, TokenizeChatRequest))
    async def tokenize_route(request: Request) -> Response:
        return await answer(gateway, URL, request, work)

    return router

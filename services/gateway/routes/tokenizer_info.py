"""GET /tokenizer_info (vLLM's): the tokenizer's configuration, class and chat template; with
several models, the default model's (vLLM's route takes no model)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from baton.services.gateway.state import Gateway
from baton.services.openai.tokenizer_info import TokenizerInfoResponse, tokenizer_info


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    # the tokenizer does not change while serving
    info = tokenizer_info(gateway.default_model.tokenizer)

    @router.get("/tokenizer_info", response_model=TokenizerInfoResponse)
    async def tokenizer_info_route() -> dict[str, Any]:
        return info

    return router

"""GET /tokenizer_info (vLLM's): the tokenizer's configuration, class and chat template."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from baton.services.gateway.state import Gateway
from baton.services.openai.tokenizer_info import TokenizerInfoResponse, tokenizer_info


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    info = tokenizer_info(gateway.tokenizer)  # the tokenizer does not change while serving

    @router.get("/tokenizer_info", response_model=TokenizerInfoResponse)
    async def tokenizer_info_route() -> dict[str, Any]:
        return info

    return router

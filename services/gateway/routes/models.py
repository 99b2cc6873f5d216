"""GET /v1/models and GET /v1/models/{model_id}: the one model this gateway serves, as vLLM's
model cards (the checkpoint as `root`, `parent` None for a base model)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from baton.services.gateway.routes.json_route import unknown_model
from baton.services.gateway.state import Gateway
from baton.services.openai.models import ModelCard, ModelList, model_card


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    def card() -> dict[str, Any]:
        # read at each request: the workers' limit and name may arrive after start
        return model_card(gateway.model_name, str(gateway.config.model), gateway.max_model_len)

    @router.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    # `:path`: served names may hold a slash (org/name), as Hugging Face ids do
    @router.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def model(model_id: str) -> Response:
        return unknown_model(gateway, model_id) or JSONResponse(card())

    return router

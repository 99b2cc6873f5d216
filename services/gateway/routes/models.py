"""GET /v1/models and GET /v1/models/{model_id}: the base models this gateway serves and the LoRA
adapters their workers serve, as vLLM's model cards (the checkpoint as `root`, `parent` None for the
base model and the base model's name for an adapter)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from baton.services.gateway.routes.json_route import unknown_model
from baton.services.gateway.state import Gateway
from baton.services.openai.models import ModelCard, ModelList, model_card


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    def card(model_id: str | None = None) -> dict[str, Any]:
        # read at each request: the workers' limits, names and adapters may arrive after start
        served, adapter = gateway.resolve(model_id)
        if adapter is None:
            return model_card(served.name, served.path, served.max_model_len)
        return model_card(adapter, adapter, served.max_model_len, parent=served.name)

    @router.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card(name) for name in gateway.served_names()]}

    # `:path`: served names may hold a slash (org/name), as Hugging Face ids do
    @router.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def model(model_id: str) -> Response:
        return unknown_model(gateway, model_id) or JSONResponse(card(model_id))

    return router

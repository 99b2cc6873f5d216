"""/v1/models: the one model this gateway serves."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from baton.services.gateway.state import Gateway


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list", "data": [{
                "id": gateway.model_name, "object": "model", "created": 0, "owned_by": "baton",
                "max_model_len": gateway.max_model_len
            }]
        }

    return router

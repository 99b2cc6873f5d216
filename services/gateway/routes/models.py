"""/v1/models: the model this gateway serves and its LoRA adapters (each with `parent` the base
model, as vLLM lists them)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from baton.services.gateway.state import Gateway


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        base = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "baton",
                "root": gateway.model_name, "parent": None, "max_model_len": gateway.max_model_len}
        adapters = [{**base, "id": name, "root": name, "parent": gateway.model_name}
                    for name in sorted(gateway.lora_adapters)]
        return {"object": "list", "data": [base, *adapters]}

    return router

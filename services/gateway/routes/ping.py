"""GET and POST /ping: SageMaker's health check (vLLM serves it), answered as /health is."""
from __future__ import annotations

from fastapi import APIRouter

from baton.services.gateway.routes.health import HEALTHY


def routes() -> APIRouter:
    router = APIRouter()

    @router.get("/ping")
    @router.post("/ping")
    async def ping() -> dict[str, str]:
        return HEALTHY

    return router

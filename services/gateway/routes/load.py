"""GET /load (vLLM's): the server's load, the requests it is serving now, as vLLM's
`server_load`; a load balancer in front of several gateways can pick the least loaded."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from baton.services.gateway.state import Gateway


class LoadResponse(BaseModel):
    server_load: int


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/load", response_model=LoadResponse)
    async def load() -> dict[str, int]:
        # the in-flight gauge the requests move (services/gateway/serving.py:Serving.start/end):
        # one count, not a second one to keep in step
        value = gateway.registry.get_sample_value(gateway.metrics.IN_FLIGHT) or 0.0
        return {"server_load": int(value)}

    return router

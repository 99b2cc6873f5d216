"""/health (the process answers), /ready (it can serve: not draining, the router reachable) and
/metrics, unless the metrics have a port of their own. FastAPI serves /openapi.json and the docs
pages itself; with auth on, services/gateway/ops_auth.py puts them behind a key."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from baton.services.gateway.errors import error_response
from baton.services.gateway.state import Gateway

HEALTHY = {"status": "ok"}


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        return HEALTHY

    @router.get("/ready")
    async def ready() -> Response:
        problem = gateway.not_ready()
        if problem is not None:
            return error_response(503, problem, "service_unavailable")
        return JSONResponse({"status": "ready"})

    if gateway.config.metrics_port is None:  # otherwise served there only
        @router.get("/metrics", response_class=PlainTextResponse)  # documented as text, not JSON
        async def metrics() -> Response:
            return Response(generate_latest(gateway.registry), media_type=CONTENT_TYPE_LATEST)

    return router

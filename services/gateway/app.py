"""The OpenAI-compatible HTTP API (FastAPI), assembled from one module per endpoint in routes/:
/v1/models, /v1/completions, /v1/chat/completions, /v1/responses (and its stored responses),
/health, /ready, /metrics, and FastAPI's own
/openapi.json and docs pages. Each generating request is authenticated, rate-limited, tokenized,
and its n choices are served through the orchestrator (router placement, prefill, hand-off,
decode)."""
from __future__ import annotations

from fastapi import FastAPI

from baton.services.gateway.errors import install_handlers
from baton.services.gateway.ops_auth import KeyRequired
from baton.services.gateway.routes import chat, completions, health, models, responses
from baton.services.gateway.serving import Serving
from baton.services.gateway.state import Gateway


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Baton gateway", description="OpenAI-compatible API for Baton")
    install_handlers(app)
    if gateway.keys is not None:
        app.add_middleware(KeyRequired, keys=gateway.keys)
    serving = Serving(gateway)
    app.include_router(models.routes(gateway))
    app.include_router(health.routes(gateway))
    app.include_router(completions.routes(serving))
    app.include_router(chat.routes(serving))
    app.include_router(responses.routes(serving))
    return app

"""The OpenAI-compatible HTTP API (FastAPI), assembled from one module per endpoint in routes/:
/v1/models (and /v1/models/{id}), /v1/completions, /v1/chat/completions, /v1/responses (and its
stored responses), vLLM's /tokenize, /detokenize, /tokenizer_info, /version, /ping, /load and its
runtime /v1/load_lora_adapter and /v1/unload_lora_adapter, SageMaker's /invocations, /health,
/ready, /metrics, and FastAPI's own /openapi.json and docs pages. Each generating request is
authenticated, rate-limited, tokenized, and its n choices are served through the orchestrator
(router placement, prefill, hand-off, decode)."""
from __future__ import annotations

from fastapi import FastAPI

from baton.services.gateway.errors import install_handlers
from baton.services.gateway.ops_auth import KeyRequired
from baton.services.gateway.routes import (chat, completions, detokenize, health, invocations, load,
                                           lora_adapters, models, ping, responses, tokenize,
                                           tokenizer_info, version)
from baton.services.gateway.serving import Serving
from baton.services.gateway.state import Gateway


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Baton gateway", description="OpenAI-compatible API for Baton")
    install_handlers(app)
    if gateway.keys is not None:
        app.add_middleware(KeyRequired, keys=gateway.keys)
    serving = Serving(gateway)
    for router in (models.routes(gateway), health.routes(gateway), ping.routes(),
                   version.routes(), load.routes(gateway), tokenize.routes(gateway),
                   detokenize.routes(gateway), tokenizer_info.routes(gateway),
                   completions.routes(serving), chat.routes(serving),
                   responses.routes(serving), invocations.routes(serving),
                   lora_adapters.routes(gateway)):
        app.include_router(router)
    return app

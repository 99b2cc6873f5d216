"""The paths that take an API key without authenticating the request themselves: those that
describe the service (/metrics, with tenant names and their token counts, the OpenAPI schema and
its docs pages, /load) and the model (/v1/models, /tokenizer_info), the tokenizer's (/tokenize,
/detokenize), and /invocations, checked before it reads a body to dispatch. With auth on they take
a key like the API itself; /health, /ready, /ping and /version stay open for probes. Prometheus
scrapes the separate metrics port instead (`--metrics-port`), which needs no key and is kept off
the public Service."""
from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from baton.services.gateway.errors import error_response
from baton.services.gateway.tenants import AuthError, KeyStore

KEYED_PATHS = frozenset({
    "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/load", "/v1/models",
    "/tokenizer_info", "/tokenize", "/detokenize", "/invocations"})
KEYED_PREFIXES = ("/v1/models/",)


class KeyRequired:
    """ASGI middleware: a request for one of KEYED_PATHS (or under KEYED_PREFIXES) without a valid
    key is answered 401."""

    def __init__(self, app: ASGIApp, keys: KeyStore) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] in KEYED_PATHS
                                        or scope["path"].startswith(KEYED_PREFIXES)):
            try:
                self.keys.tenant_for(Headers(scope=scope).get("authorization"))
            except AuthError as e:
                await error_response(401, str(e), "invalid_api_key")(scope, receive, send)
                return
        await self.app(scope, receive, send)

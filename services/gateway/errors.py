"""OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}` with the right
status."""
from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from baton.services.openai.errors import ProtocolError

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's "client closed request"


def error_response(status: int, message: str, code: str, param: str | None = None,
                   retry_after_s: float | None = None) -> JSONResponse:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))
               } if retry_after_s is not None else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def protocol_error_response(error: ProtocolError) -> JSONResponse:
    # A body refused for its size is left unread: closing the connection spares reading it all to
    # find where the next request starts.
    headers = {"Connection": "close"} if error.status == 413 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, str(exc.detail), code)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # The client closed the connection (or it was closed for a body too slow, which
        # http_timeouts logs) before its request was read: nobody is left to answer.
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed unexpectedly", request.method, request.url.path, exc_info=exc)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")

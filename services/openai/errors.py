"""The one error every OpenAI endpoint refuses a request with, shaped as OpenAI's error body."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ProtocolError(ValueError):
    """A request the server refuses, carrying what the OpenAI error body needs."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value",
                 status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {
                "message": self.message, "type": kind, "param": self.param, "code": self.code
            }
        }


def from_validation_error(error: ValidationError) -> ProtocolError:
    """pydantic's first complaint, as a 400 naming the field by its JSON path."""
    first = error.errors()[0]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                    for p in first["loc"]).lstrip(".") or None
    if first["type"] == "extra_forbidden":
        message = f"unknown or unsupported field `{param}`"
    else:
        detail = first["msg"].removeprefix("Value error, ")
        message = f"{param}: {detail}" if param else detail
    return ProtocolError(message, param=param)

"""Deadlines on the gateway's HTTP connections, which uvicorn leaves open too long.

uvicorn closes a keep-alive connection left idle after a response, but sets no deadline on a
connection that never sends a request, on a request's head or on its body: a client (or a slowloris
attack) that opens connections and trickles bytes holds each one, and its buffers, for as long as it
likes. Here each phase of a connection has a deadline, counted from the start of the phase so that a
trickle of bytes does not push it back:

- idle: no request under way (a new connection, or one kept alive between requests): closed;
- head: from a request's first byte to the end of its headers: 408, then closed;
- body: from the end of its headers to the end of its body: 408 (unless a response has begun),
  then closed.

While the application works on a complete request (a long stream, say) no deadline runs. The phases
come from h11's connection states, so the gateway runs uvicorn's h11 protocol, which it would pick
anyway where httptools is not installed."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deadlines:
    idle_s: float
    header_s: float
    body_s: float


def _timeout_response(what: str, limit_s: float) -> bytes:
    body = json.dumps({
        "error": {
            "message": f"the request's {what} did not arrive within {limit_s:g} s",
            "type": "invalid_request_error", "param": None, "code": "request_timeout"
        }
    }).encode()
    head = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each phase of a connection; timed_protocol makes
    the subclass that carries the deadlines."""
    limits: ClassVar[dict[str, float]]  # by phase: idle, header, body
    answers: ClassVar[dict[str, bytes]]  # the 408 for a late header or body
    on_timeout: ClassVar[Callable[[str], None]]
    _phase: str | None = None
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _phase_now(self) -> str | None:
        their = self.conn.their_state
        if their is h11.SEND_BODY:
            return "body"
        if their is h11.IDLE and self.conn.our_state is h11.IDLE:
            return "header" if self.conn.trailing_data[0] else "idle"
        return None  # the request is in; the application has it

    def _follow(self) -> None:
        """Starts the deadline of the phase the connection is in; one already running for this
        phase keeps running."""
        phase = self._phase_now() if not self.transport.is_closing() else None
        if phase == self._phase:
            return
        self._disarm()
        self._phase = phase
        if phase is not None:
            self._timer = self.loop.call_later(self.limits[phase], self._expire, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expire(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if phase != "idle":
            self.on_timeout(phase)
            log.info("connection from %s closed: the request's %s did not arrive within "
                     "%g s%s", _address(self.client), "head" if phase == "header" else "body",
                     self.limits[phase], self._request_line() if phase == "body" else "")
            # A response under way cannot be replaced by another.
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.write(self.answers[phase])
        self.transport.close()

    def _request_line(self) -> str:
        scope: Any = self.scope
        return f" ({scope['method']} {scope['path']})"


def timed_protocol(deadlines: Deadlines,
                   on_timeout: Callable[[str], None]) -> type[H11Protocol]:
    """An h11 protocol class for uvicorn (`Config(http=...)`) that enforces `deadlines`;
    `on_timeout(phase)` is called for each connection closed for a late head or body."""
    limits = {"idle": deadlines.idle_s, "header": deadlines.header_s, "body": deadlines.body_s}
    answers = {"header": _timeout_response("head", deadlines.header_s),
               "body": _timeout_response("body", deadlines.body_s)}
    return type("TimedH11Protocol", (TimedH11Protocol,),
                {"limits": limits, "answers": answers, "on_timeout": staticmethod(on_timeout)})


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"

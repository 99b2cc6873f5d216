"""A tiny HTTP server for a process's /metrics, /health (alive) and /ready (taking new work), for
Prometheus and Kubernetes probes; gRPC-only services (worker, router) run it beside their gRPC port.

A service may add a few JSON routes for cluster tooling (the router's /stats and /admin/drain for
the operator): a GET route is called with no argument, a POST route with the parsed JSON body; each
returns a JSON-able value. A handler that raises ValueError answers 400 with its message."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

JSON_TYPE = "application/json"
MAX_BODY_BYTES = 1 << 20  # admin requests are a few ids; a larger body is a mistake or an attack


class ProbeHandler(BaseHTTPRequestHandler):
    """The probe routes; serve_probes makes the subclass that carries a service's registry,
    readiness check and extra routes."""
    registry: ClassVar[CollectorRegistry]
    ready: ClassVar[Callable[[], bool]]
    gets: ClassVar[dict[str, Callable[[], Any]]]
    posts: ClassVar[dict[str, Callable[[Any], Any]]]

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/health":
            self._send(200, b"ok\n")
        elif path == "/ready":
            ok = self.ready()
            self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
        elif path in self.gets:
            self._answer(self.gets[path])
        else:
            self._send(404, b"not found\n")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        route = self.posts.get(path)
        if route is None:
            known = path in self.gets or path in ("/metrics", "/health", "/ready")
            self._send(405 if known else 404,
                       b"method not allowed\n" if known else b"not found\n")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, b"body too large\n")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            self._send(400, b"body is not JSON\n")
            return
        self._answer(lambda: route(body))

    def _answer(self, call: Callable[[], Any]) -> None:
        try:
            result = call()
        except ValueError as e:
            self._send(400, json.dumps({"error": str(e)}).encode(), JSON_TYPE)
            return
        self._send(200, json.dumps(result).encode(), JSON_TYPE)

    def _send(self, status: int, body: bytes,
              content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # scrapes every few seconds are not news
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_probes(
        host: str, port: int, registry: CollectorRegistry, ready: Callable[[], bool],
        get_routes: Mapping[str, Callable[[], Any]] | None = None,
        post_routes: Mapping[str, Callable[[Any], Any]] | None = None) -> ThreadingHTTPServer:
    """Starts the server on a daemon thread and returns it (its server_address holds the bound
    port). Routes run on the server's threads, so what they call must be thread-safe."""
    handler = type("Handler", (ProbeHandler,), {
        "registry": registry, "ready": staticmethod(ready), "gets": dict(get_routes or {}),
        "posts": dict(post_routes or {})})
    server = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name="http-probes", daemon=True).start()
    return server

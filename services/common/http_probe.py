"""A tiny HTTP server for a process's /metrics, /health (alive) and /ready (taking new work), for Prometheus and
Kubernetes probes; gRPC-only services (worker, router) run it beside their gRPC port."""
from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve_probes(host: str, port: int, registry: CollectorRegistry,
                 ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """Starts the server on a daemon thread and returns it (its server_address holds the bound port)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/health":
                self._send(200, b"ok\n")
            elif path == "/ready":
                ok = ready()
                self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes every few seconds are not news
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http-probes", daemon=True).start()
    return server

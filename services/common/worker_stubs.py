"""Worker stubs by address, one channel each, kept for the process's life: a gRPC channel
reconnects on its own, and one per call would redo the TCP and HTTP/2 handshakes every time."""
from __future__ import annotations

import grpc

from baton.v1 import worker_pb2_grpc

RECONNECT_MIN_S, RECONNECT_MAX_S = 0.1, 5.0
# gRPC's own reconnect back-off grows to 120 s: a service restarted on its address (or one that
# started late) would be refused that long after it listens again, calls failing fast meanwhile.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", int(RECONNECT_MIN_S * 1000)),
                     ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX_S * 1000))]


class WorkerStubs:
    def __init__(self) -> None:
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}

    def get(self, address: str) -> worker_pb2_grpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(
                grpc.aio.insecure_channel(address, options=RECONNECT_OPTIONS))
        return stub

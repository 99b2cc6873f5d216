"""Worker stubs by address, one channel each, kept for the process's life: a gRPC channel
reconnects on its own, and one per call would redo the TCP and HTTP/2 handshakes every time."""
from __future__ import annotations

import grpc

from baton.v1 import worker_pb2_grpc


class WorkerStubs:
    def __init__(self) -> None:
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}

    def get(self, address: str) -> worker_pb2_grpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(
                grpc.aio.insecure_channel(address))
        return stub

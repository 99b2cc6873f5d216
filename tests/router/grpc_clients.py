"""Sync gRPC helpers for the router service tests (the processes come from tests/launcher.py)."""
from __future__ import annotations

from dataclasses import dataclass

import grpc

from baton.v1 import router_pb2 as rpb
from baton.v1 import router_pb2_grpc
from baton.v1 import worker_pb2 as wpb
from baton.v1 import worker_pb2_grpc


@dataclass
class RouterClient:
    address: str

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = router_pb2_grpc.RouterStub(self.channel)

    def place(self, request_id: str, prompt: list[int], **fields) -> rpb.Placement:
        request = rpb.PlaceRequest(request_id=request_id, prompt_token_ids=prompt, **fields)
        return self.stub.Place(request, timeout=10)

    def release(self, lease_id: str, **fields) -> None:
        self.stub.Release(rpb.ReleaseRequest(lease_id=lease_id, **fields), timeout=10)

    def pool(self, role: int = rpb.WORKER_ROLE_MIXED) -> rpb.PoolStats:
        stats = self.stub.GetStats(rpb.GetRouterStatsRequest(), timeout=10)
        return next(p for p in stats.pools if p.role == role)


def worker_id_of(address: str) -> str:
    stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))
    return stub.GetStats(wpb.GetStatsRequest(), timeout=10).worker_id


def generate_on(address: str, request_id: str, prompt: list[int], max_tokens: int = 1) -> list[int]:
    """Runs a request on a worker directly (bypassing the router), so its cache fills without a
    placement."""
    stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))
    request = wpb.GenerateRequest(meta=wpb.RequestMeta(request_id=request_id),
                                  prompt_token_ids=prompt,
                                  params=wpb.SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t for message in stub.Generate(request, timeout=30) for t in message.token_ids]

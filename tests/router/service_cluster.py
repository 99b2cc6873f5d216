"""Real router and simulated-worker processes on loopback, started side by side, and sync gRPC helpers."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.v1 import router_pb2 as rpb
from baton.v1 import router_pb2_grpc
from baton.v1 import worker_pb2 as wpb
from baton.v1 import worker_pb2_grpc

MODEL = "tiny-llama"  # the embedded model's folder name, which sim workers serve under (part of every hash)
SIM_BLOCKS = 256


def launch_sim_worker(name: str, *extra: str) -> tuple[ServiceProcess, str]:
    """The process and the address it will serve on (known before it is ready, so routers can start beside it)."""
    port = free_port()
    args = ["worker", "--engine", "sim", "--role", "mixed", "--port", str(port), "--kv-transport", "grpc",
            "--num-kv-blocks", str(SIM_BLOCKS), *extra]
    return launch_service(name, args, env={"BATON_NUM_THREADS": "1"}), f"127.0.0.1:{port}"


def launch_router(name: str, *extra: str) -> tuple[ServiceProcess, int]:
    metrics_port = free_port()
    args = ["router", "--port", str(free_port()), "--model", MODEL, "--metrics-port", str(metrics_port),
            "--stats-poll-interval-s", "0.1", "--tick-interval-s", "0.1", *extra]
    return launch_service(name, args), metrics_port


@dataclass
class RouterClient:
    address: str

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = router_pb2_grpc.RouterStub(self.channel)

    def place(self, request_id: str, prompt: list[int], **fields) -> rpb.Placement:
        return self.stub.Place(rpb.PlaceRequest(request_id=request_id, prompt_token_ids=prompt, **fields),
                               timeout=10)

    def release(self, lease_id: str, **fields) -> None:
        self.stub.Release(rpb.ReleaseRequest(lease_id=lease_id, **fields), timeout=10)

    def pool(self, role: int = rpb.WORKER_ROLE_MIXED) -> rpb.PoolStats:
        stats = self.stub.GetStats(rpb.GetRouterStatsRequest(), timeout=10)
        return next(p for p in stats.pools if p.role == role)


def worker_id_of(address: str) -> str:
    return worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address)).GetStats(wpb.GetStatsRequest(),
                                                                                 timeout=10).worker_id


def generate_on(address: str, request_id: str, prompt: list[int], max_tokens: int = 1) -> list[int]:
    """Runs a request on a worker directly (bypassing the router), so its cache fills without a placement."""
    stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))
    request = wpb.GenerateRequest(meta=wpb.RequestMeta(request_id=request_id), prompt_token_ids=prompt,
                                  params=wpb.SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t for message in stub.Generate(request, timeout=30) for t in message.token_ids]


def stop_all(services: list[ServiceProcess], timeout: float = 15.0) -> list[int]:
    """SIGTERM to all at once, then the exit codes: each drains in parallel rather than one after another."""
    for service in services:
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
    codes = []
    for service in services:
        # One signal only: a second one landing after the service's loop closed would kill it mid-exit.
        try:
            codes.append(service.process.wait(timeout))
        except subprocess.TimeoutExpired:
            service.kill()
            codes.append(service.process.returncode)
    return codes


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.05)

"""Real worker processes on loopback for the tests, and small async helpers to talk to them."""
from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from baton.services.common.handoff_client import stream_tokens
from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.v1 import worker_pb2 as pb
from baton.v1 import worker_pb2_grpc

KV_BLOCKS = 256  # small caches start fast; every test prompt fits many times over


@dataclass
class Worker:
    service: ServiceProcess
    metrics_port: int

    @property
    def address(self) -> str:
        return self.service.address

    def stub(self) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(grpc.aio.insecure_channel(self.address))

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples (matching labels) from a live /metrics scrape."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
            if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
                total += float(match.group(2))
        return total


def start_workers(model: Path, roles: Sequence[str], transport: str = "nixl", *extra: str) -> list[Worker]:
    """Starts one worker per role side by side and returns them once all are serving."""
    workers = []
    for role in roles:
        metrics_port = free_port()
        args = ["worker", "--role", role, "--model", str(model), "--port", str(free_port()),
                "--kv-port", str(free_port()), "--metrics-port", str(metrics_port), "--kv-transport", transport,
                "--num-kv-blocks", str(KV_BLOCKS), *extra]
        workers.append(Worker(launch_service(f"{role}-worker", args, env={"BATON_NUM_THREADS": "1"}),
                              metrics_port))
    for worker in workers:
        worker.service.wait_ready()
    return workers


def greedy_params(max_tokens: int) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def collect(decode: Worker, prefill: Worker | None, request_id: str, prompt: Sequence[int],
                  params: pb.SamplingParams) -> tuple[list[int], str]:
    """All tokens of one request and how its prompt's KV arrived. (grpc.aio channels belong to the event loop
    that made them, so stubs are made here, inside the test's loop.)"""
    tokens, source = [], ""
    async for message in stream_tokens(decode.stub(), prefill.stub() if prefill else None,
                                       pb.RequestMeta(request_id=request_id), prompt, params):
        tokens += message.token_ids
        source = message.kv_source or source
    return tokens, source


async def run_all(decode: Worker, prefill: Worker | None,
                  prompts: list[list[int]], params: pb.SamplingParams, prefix: str) -> list[tuple[list[int], str]]:
    return await asyncio.gather(*(collect(decode, prefill, f"{prefix}-{i}", p, params)
                                  for i, p in enumerate(prompts)))

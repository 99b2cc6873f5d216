"""`baton bench gateway`: what one gateway process adds to a request, and the streamed tokens/s it
sustains.

A router and one simulated worker (`--engine sim`, step times zero) run beside the gateway, so the
workers are never the bottleneck and what is measured is the gateway's own work (HTTP, tokenizing,
placement, SSE chunks).

- latency: sequential streamed requests of one token, time to the first token through the gateway
  against the same request sent straight to the worker over gRPC; the difference is the gateway's
  added latency (its router placement included).
- throughput: concurrent streamed completions; tokens counted from each stream's usage chunk. Tokens
  per gateway CPU-second is also given: on a shared machine the wall-clock rate also depends on the
  neighbours' load.

With --rate-limit-store REDIS_URL the same is measured twice in one run, one row each: the tenant's
limits kept in the gateway's memory, then in Redis (a Lua script at admission, another at
settlement), so the store's cost shows side by side.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import socket
import time
import uuid
from pathlib import Path

from baton.loadtest.sim.replay import quantile
from baton.loadtest.commands.tables import table
from baton.services.common.process import ServiceProcess, free_port, launch_service

_ZERO_STEP = [
    "--engine", "sim", "--sim-step-base-seconds", "0", "--sim-decode-seconds-per-sequence", "0",
    "--sim-prefill-tokens-per-second", "1e12"
]


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser("gateway", help="gateway added latency and streamed tokens/s",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens [default: 128]")
    parser.add_argument("--latency-requests", type=int, default=200,
                        help="sequential one-token requests")
    parser.add_argument("--streams", type=int, default=32,
                        help="throughput: concurrent streams [default: 32]")
    parser.add_argument("--stream-requests", type=int, default=128,
                        help="throughput: streams in all")
    parser.add_argument("--max-tokens", type=int, default=512, help="throughput: tokens per stream")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate-limit-store", default=None,
                        help="also measure a gateway keeping its limits in this Redis URL")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write the figures to this file")
    parser.set_defaults(func=run)


def _start(started: list[ServiceProcess]) -> tuple[ServiceProcess, ServiceProcess]:
    """Worker and router, each put at the front of `started` so a failure stops them all."""
    worker = launch_service("sim-worker", ["worker", "--role", "mixed", "--port", str(free_port()),
                                           "--metrics-port", str(free_port()),
                                           "--kv-transport", "grpc", *_ZERO_STEP],
                            env={"BATON_NUM_THREADS": "1"})
    started.insert(0, worker.wait_ready())
    router = launch_service("router", ["router", "--port", str(free_port()),
                                       "--metrics-port", str(free_port()), "--model", "tiny-llama",
                                       "--workers", worker.address])
    started.insert(0, router.wait_ready())
    return worker, router


def _start_gateway(started: list[ServiceProcess], router: ServiceProcess,
                   store: str | None) -> ServiceProcess:
    """A gateway (no auth) whose default tenant has limits never reached: each request is admitted
    and settled as a limited one is."""
    where = [] if store is None else [
        "--rate-limit-store", store, "--rate-limit-key-prefix", f"baton-bench:{uuid.uuid4().hex}:"]
    gateway = launch_service("gateway", ["gateway", "--host", "127.0.0.1",
                                         "--port", str(free_port()), "--router", router.address,
                                         "--no-auth",
                                         "--default-requests-per-minute", "1000000000",
                                         "--default-tokens-per-minute", "1000000000000", *where])
    started.insert(0, gateway.wait_ready())
    return gateway


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _direct_ttft(address: str, prompt: list[int]) -> float:
    import grpc

    from baton.v1 import worker_pb2 as wpb
    from baton.v1 import worker_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        request = wpb.GenerateRequest(meta=wpb.RequestMeta(request_id=f"direct-{random.random()}"),
                                      prompt_token_ids=prompt,
                                      params=wpb.SamplingParams(max_tokens=1))
        started = time.perf_counter()
        async for message in stub.Generate(request, timeout=30):
            if message.token_ids:
                return time.perf_counter() - started
    raise RuntimeError("the worker streamed no token")


async def _stream(client, url: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """Time to the first chunk and the completion tokens of one streamed completion. The body is
    only scanned, not parsed line by line: the client shares the machine with the gateway and should
    cost it as little as it can."""
    body = {
        "prompt": prompt, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True}
    }
    started, first, tail = time.perf_counter(), None, b""
    # A fresh connection per request: on a kept-alive one the first chunk waited ~40 ms (a
    # delayed-ACK stall, not yet explained), which would swamp the gateway's own cost.
    async with client.stream("POST", url, json=body, timeout=120,
                             headers={"connection": "close"}) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"the gateway answered {response.status_code}: {await response.aread()!r}")
        async for data in response.aiter_raw():
            if first is None and b"data: {" in data:
                first = time.perf_counter() - started
            tail = (tail + data)[-8192:]
    # the last chunk before [DONE] carries the usage
    usage = tail[tail.rfind(b"data: {") + len(b"data: "):]
    tokens = json.loads(usage[:usage.index(b"\n")])["usage"]["completion_tokens"]
    return (first if first is not None else float("nan")), tokens


async def _measure(args: argparse.Namespace, worker: ServiceProcess,
                   gateway: ServiceProcess) -> list[dict]:
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    rng = random.Random(args.seed)
    url = f"http://{gateway.address}/v1/completions"
    prompts = [[rng.randrange(10, 500) for _ in range(args.prompt_len)]
               for _ in range(args.latency_requests)]
    limits = httpx.Limits(max_connections=args.streams + 4,
                          max_keepalive_connections=args.streams + 4)
    # TCP_NODELAY, as curl sets it: httpx leaves Nagle on, and writes a POST's headers and body
    # separately.
    nodelay = httpx.AsyncHTTPTransport(limits=limits,
                                       socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx.AsyncClient(transport=nodelay) as client:
        for prompt in prompts[:10]:  # warm-up: connections, first-call imports
            await _stream(client, url, prompt, 1)
            await _direct_ttft(worker.address, prompt)
        direct = sorted([await _direct_ttft(worker.address, p) for p in prompts])
        through = sorted([(await _stream(client, url, p, 1))[0] for p in prompts])
        pending = iter(range(args.stream_requests))
        totals = {"tokens": 0}

        async def streamer() -> None:
            for _ in pending:
                prompt = [rng.randrange(10, 500) for _ in range(args.prompt_len)]
                tokens = (await _stream(client, url, prompt, args.max_tokens))[1]
                # after the await: `+=` around it would lose other streams' counts
                totals["tokens"] += tokens

        cpu0, t0 = _cpu_seconds(gateway.process.pid), time.perf_counter()
        await asyncio.gather(*(streamer() for _ in range(args.streams)))
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(gateway.process.pid) - cpu0
    # the two runs are not paired request by request: quantile minus quantile
    def added_ms(q: float) -> float:
        return (quantile(through, q) - quantile(direct, q)) * 1e3

    return [
        dict(direct_ttft_p50_ms=quantile(direct, 0.5) * 1e3,
             gateway_ttft_p50_ms=quantile(through, 0.5) * 1e3, added_p50_ms=added_ms(0.5),
             added_p99_ms=added_ms(0.99), streams=args.streams, tokens=totals["tokens"],
             tokens_per_s=totals["tokens"] / wall, gateway_cpu_s=cpu,
             tokens_per_gateway_cpu_s=totals["tokens"] / cpu if cpu else float("nan"))
    ]


def run(args: argparse.Namespace) -> int:
    load = os.getloadavg()  # before the run, which adds its own load
    started: list[ServiceProcess] = []
    rows = []
    try:
        worker, router = _start(started)
        stores = [None] + ([args.rate_limit_store] if args.rate_limit_store else [])
        for store in stores:
            gateway = _start_gateway(started, router, store)
            limits = {"limits": "in-process" if store is None else "redis"}
            rows += [{**limits, **row} for row in asyncio.run(_measure(args, worker, gateway))]
            gateway.terminate()
    finally:
        for service in started:
            service.terminate()
    print(table(rows))
    if args.output_json is not None:
        arguments = {k: str(v) for k, v in vars(args).items() if k != "func"}
        doc = {"args": arguments, "load_average": load, "cpus": os.cpu_count(), "results": rows}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0

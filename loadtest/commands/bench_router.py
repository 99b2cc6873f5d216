"""`baton bench router --mode decisions|grpc|replay`: the router's decision cost and its routing
quality.

- decisions: the in-process Router facade with N workers (no network): placements/s and decision
  latency for prompts of a given length, half of them sharing cached prefixes.
- grpc: a `baton router` process over simulated worker processes, driven by concurrent Place +
  Release calls.
- replay: the Mooncake trace through the router onto simulated workers with finite caches, in
  virtual time (loadtest/sim/replay.py), per policy: prefix-aware, load-only and round-robin.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import time
from pathlib import Path

from baton.loadtest.commands.tables import table
from baton.loadtest.sim.overload import bench_overload
from baton.loadtest.sim.replay import quantile
from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.messages.worker import EventKind, KVEvent, KVEventBatch, LoadReport
from baton.services.common.roles import Role
from baton.services.router.config import RouterConfig
from baton.services.router.router import Router

GRPC_WORKERS = 4


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser("router", help="router decision cost and routing quality",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("decisions", "grpc", "replay", "overload"),
                        default="decisions")
    parser.add_argument("--workers", type=int, default=64, help="decisions: workers [default: 64]")
    parser.add_argument("--replay-workers", type=int, default=8,
                        help="replay: simulated workers [default: 8]")
    parser.add_argument("--prompt-len", type=int, default=2048,
                        help="decisions, grpc: prompt tokens")
    parser.add_argument("--requests", type=int, default=5000,
                        help="placements to time, or trace rows to replay")
    parser.add_argument("--concurrency", type=int, default=32, help="grpc: concurrent callers")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="grpc: how long to drive the router")
    parser.add_argument("--speedup", type=float, default=60.0,
                        help="replay: arrivals compressed by this factor")
    parser.add_argument(
        "--trace-scale", type=float, default=32.0,
        help="replay: Mooncake lengths divided by this (32: one hash id = one 16-token block)")
    parser.add_argument("--kv-blocks", type=int, default=2048,
                        help="replay: KV blocks per simulated worker")
    parser.add_argument("--ttft-slo-ms", type=float, default=500.0,
                        help="replay: SLO that counts as goodput")
    parser.add_argument("--policies", nargs="+", default=["prefix", "load", "round-robin"],
                        help="replay: which policies to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write the figures to this file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = {"decisions": bench_decisions, "grpc": bench_grpc, "replay": bench_replay,
            "overload": bench_overload}[args.mode](args)
    print(table(rows))
    if args.output_json is not None:
        doc = {"args": {k: str(v) for k, v in vars(args).items() if k != "func"}, "results": rows}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


# -- decisions -------------------------------------------------------------------------------------


def _decision_router(args: argparse.Namespace,
                     rng: random.Random) -> tuple[Router, list[list[int]]]:
    """A router with args.workers workers (a quarter prefill), fresh stats, and 32 prefixes of half
    the prompt length cached across them; returns it and the prefixes."""
    router = Router(RouterConfig(model="bench"))
    far_future_s = int((time.time() + 3600) * 1000) / 1000  # stats stay fresh for the whole run
    for i in range(args.workers):
        role = Role.PREFILL if i % 4 == 0 else Role.DECODE
        router.register_worker(f"w{i}", f"10.0.0.{i}:50051", role, lease_ttl_s=float("inf"))
        router.on_stats(LoadReport(timestamp_s=far_future_s, kv_blocks_total=100_000,
                                   worker_id=f"w{i}", role=role))
    prefixes = [[rng.randrange(1, 50_000) for _ in range(args.prompt_len // 2)] for _ in range(32)]
    for j, prefix in enumerate(prefixes):
        worker_id = f"w{(j * 5) % args.workers}"
        event = KVEvent(1, EventKind.STORED, tuple(block_hashes(prefix, 16, "bench")))
        router.on_kv_events(KVEventBatch(worker_id, (event,)))
    return router, prefixes


def bench_decisions(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    router, prefixes = _decision_router(args, rng)
    half = args.prompt_len - args.prompt_len // 2
    requests = [
        PlaceRequest(f"r{i}", prefixes[i % 32] + [rng.randrange(1, 50_000)
                                                  for _ in range(half)], max_tokens=64)
        for i in range(args.requests)
    ]
    for req in requests[:200]:  # warm-up: caches, allocator
        router.release(
            router.place(PlaceRequest("warm-" + req.request_id, req.prompt_token_ids)).lease_id)
    # The pool of prompts (millions of list slots) stands in for network input a router never holds;
    # left in the collector's generations, every gen-1 pass would walk it and bill the pause to
    # whichever decision it hit.
    gc.freeze()
    latencies, affinity = [], 0
    started = time.perf_counter()
    for req in requests:
        t = time.perf_counter()
        outcome = router.place(req)
        latencies.append(time.perf_counter() - t)
        if not isinstance(outcome, Placement):
            raise RuntimeError(f"the benchmark's router refused a placement: {outcome}")
        affinity += outcome.reason == "prefix_affinity"
        router.release(outcome.lease_id)
    elapsed = time.perf_counter() - started
    gc.unfreeze()
    latencies.sort()
    return [
        dict(
            mode="in-process",
            workers=args.workers,
            prompt_tokens=args.prompt_len,
            placements=len(requests),
            placements_per_s=len(requests) / elapsed,  # place and release, one after another
            # place alone: what one core sustains
            decisions_per_s=len(requests) / sum(latencies),
            p50_ms=quantile(latencies, 0.5) * 1e3,
            p99_ms=quantile(latencies, 0.99) * 1e3,
            max_ms=latencies[-1] * 1e3,
            prefix_affinity_share=affinity / len(requests))
    ]


# -- grpc ------------------------------------------------------------------------------------------


async def _drive(address: str, prompt_len: int, concurrency: int, seconds: float,
                 seed: int) -> tuple[list[float], int]:
    import grpc

    from baton.v1 import router_pb2 as rpb
    from baton.v1 import router_pb2_grpc

    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 500) for _ in range(prompt_len // 2)] for _ in range(16)]
    stub = router_pb2_grpc.RouterStub(grpc.aio.insecure_channel(address))
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def caller(k: int) -> None:
        nonlocal errors
        i = 0
        while time.perf_counter() < deadline:
            prompt = prefixes[(k + i) %
                              16] + [rng.randrange(10, 500) for _ in range(prompt_len // 2)]
            t = time.perf_counter()
            try:
                placement = await stub.Place(
                    rpb.PlaceRequest(request_id=f"c{k}-{i}", prompt_token_ids=prompt,
                                     max_tokens=16), timeout=10)
                latencies.append(time.perf_counter() - t)
                await stub.Release(rpb.ReleaseRequest(lease_id=placement.lease_id), timeout=10)
            except grpc.aio.AioRpcError:
                errors += 1
            i += 1

    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    return latencies, errors


def bench_grpc(args: argparse.Namespace) -> list[dict]:
    from baton.services.common.process import free_port, launch_service

    ports = [free_port() for _ in range(GRPC_WORKERS)]
    workers = [
        launch_service(f"sim-{i}", [
            "worker", "--engine", "sim", "--port",
            str(p), "--kv-transport", "grpc", "--num-kv-blocks", "1024"
        ], env={"BATON_NUM_THREADS": "1"}) for i, p in enumerate(ports)
    ]
    router = launch_service("router", [
        "router", "--port", "0", "--model", "tiny-llama", "--workers", ",".join(f"127.0.0.1:{p}"
                                                                                for p in ports)
    ])
    try:
        for service in [router, *workers]:
            service.wait_ready()
        time.sleep(1.0)  # first stats polls and KV snapshots
        latencies, errors = asyncio.run(
            _drive(router.address, args.prompt_len, args.concurrency, args.seconds, args.seed))
    finally:
        for service in [router, *workers]:
            service.terminate(timeout=15)
    latencies.sort()
    return [
        dict(mode="grpc", workers=GRPC_WORKERS, prompt_tokens=args.prompt_len,
             concurrency=args.concurrency, placements=len(latencies), errors=errors,
             placements_per_s=len(latencies) / args.seconds, p50_ms=quantile(latencies, 0.5) * 1e3,
             p99_ms=quantile(latencies, 0.99) * 1e3)
    ]


# -- replay ----------------------------------------------------------------------------------------


def bench_replay(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoTokenizer

    from baton.loadtest.traces import read_trace
    from baton.loadtest.workloads import token_pool
    from baton.services.engine.config import EngineConfig
    from baton.loadtest.sim.replay import Replay, build_requests, unlimited_cache_hit_ratio
    from baton.services.checkpoints.tiny_model import embedded_model_path

    model_dir = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    pool = token_pool(tokenizer.vocab_size, set(tokenizer.all_special_ids))
    requests = build_requests(read_trace("mooncake-conv", limit=args.requests), pool,
                              args.trace_scale, args.speedup, max_len=2048, seed=args.seed)
    engine_config = EngineConfig(engine="sim", model=str(model_dir), num_kv_blocks=args.kv_blocks)
    bound = unlimited_cache_hit_ratio(requests, engine_config.block_size)
    workers = args.replay_workers
    rows = []
    for policy in args.policies:
        started = time.perf_counter()
        result = Replay(policy, engine_config, RouterConfig(), workers,
                        args.ttft_slo_ms / 1000).run(requests)
        rows.append(
            dict(policy=policy, workers=workers, requests=result.requests, rejected=result.rejected,
                 hit_ratio=result.hit_ratio, of_bound=result.hit_ratio / bound if bound else 0.0,
                 ttft_p50_ms=result.ttft_p50_s * 1e3, ttft_p99_ms=result.ttft_p99_s * 1e3,
                 goodput_rps=result.goodput_rps, slo_met=result.slo_attainment,
                 virtual_s=result.makespan_s, wall_s=time.perf_counter() - started))
    print(f"unlimited-cache bound on the same replay: {bound:.4f} of prompt tokens "
          f"({len(requests)} requests, lengths / {args.trace_scale:g}, arrivals x{args.speedup:g})")
    return rows

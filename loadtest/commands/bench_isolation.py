"""`baton bench decode-isolation`: why disaggregation exists, measured.

Eight decode streams run while prompts of 2,048 tokens keep arriving. In colocated mode (one mixed
worker) every long prefill lands in the decode streams' steps; in disaggregated mode (a prefill and
a decode worker) it runs elsewhere and only its KV arrives. Each mode is measured twice, with and
without the long prompts, and the streams' inter-token latencies (client-side, per gap) are
compared.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import grpc

from baton.loadtest.bench.throughput import machine_info
from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.services.common.sampling_params import SamplingParams
from baton.services.gateway.handoff_client import stream_tokens
from baton.v1 import worker_pb2 as pb
from baton.v1 import worker_pb2_grpc

# (role, torch threads)
MODES = {"colocated": [("mixed", 2)], "disaggregated": [("prefill", 1), ("decode", 1)]}


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "decode-isolation", help="decode ITL under long-prompt interference, colocated against "
                                 "disaggregated", description=__doc__)
    parser.add_argument(
        "--model", default=None,
        help="checkpoint folder [default: a fresh bench-preset model with a 4,096-token context]")
    parser.add_argument("--streams", type=int, default=8,
                        help="concurrent decode streams [default: 8]")
    parser.add_argument("--stream-prompt-len", type=int, default=64,
                        help="their prompt length [default: 64]")
    parser.add_argument("--stream-tokens", type=int, default=96,
                        help="tokens each stream generates [default: 96]")
    parser.add_argument("--long-prompt-len", type=int, default=2048,
                        help="interfering prompts [default: 2048]")
    parser.add_argument("--long-concurrency", type=int, default=1,
                        help="long prompts in flight at once, sent back to back [default: 1]")
    parser.add_argument("--kv-transport", choices=("nixl", "grpc"), default="nixl")
    parser.add_argument("--output-json", type=Path, default=None)
    parser.set_defaults(func=run)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _stream(decode: worker_pb2_grpc.WorkerStub, prefill: worker_pb2_grpc.WorkerStub | None,
                  rid: str, prompt: list[int], max_tokens: int) -> list[float]:
    """Inter-token gaps of one request, in seconds (a message may carry one token; gaps are per
    message)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    stamps = []
    async for message in stream_tokens(decode, prefill, pb.RequestMeta(request_id=rid), prompt,
                                       params):
        if message.token_ids:
            stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


async def _measure(args: argparse.Namespace, decode_addr: str, prefill_addr: str | None,
                   interfere: bool, tag: str) -> dict[str, float]:
    decode = worker_pb2_grpc.WorkerStub(grpc.aio.insecure_channel(decode_addr))
    prefill = worker_pb2_grpc.WorkerStub(
        grpc.aio.insecure_channel(prefill_addr)) if prefill_addr else None
    rng = random.Random(0)
    stop, long_done = asyncio.Event(), []

    async def long_prompts(slot: int) -> None:
        i = 0
        while not stop.is_set():
            prompt = [rng.randrange(10, 4000) for _ in range(args.long_prompt_len)]
            await _stream(decode, prefill, f"{tag}-long-{slot}-{i}", prompt, 2)
            long_done.append(1)
            i += 1

    background = [asyncio.ensure_future(long_prompts(s))
                  for s in range(args.long_concurrency)] if interfere else []
    if interfere:
        # let the first long prefill get going, so every stream sees interference
        await asyncio.sleep(0.5)
    streams = [
        _stream(decode, prefill, f"{tag}-s{i}",
                [rng.randrange(10, 4000)
                 for _ in range(args.stream_prompt_len)], args.stream_tokens)
        for i in range(args.streams)
    ]
    gaps = [g for per_stream in await asyncio.gather(*streams) for g in per_stream]
    stop.set()
    await asyncio.gather(*background)
    return {
        "itl_p50_ms": 1000 * _percentile(gaps, 0.5), "itl_p99_ms": 1000 * _percentile(gaps, 0.99),
        "itl_max_ms": 1000 * max(gaps), "gaps": len(gaps), "long_prompts_served": len(long_done)
    }


def _start(mode: str, model: str, transport: str) -> dict[str, ServiceProcess]:
    services = {}
    for role, threads in MODES[mode]:
        args = ["worker", "--role", role, "--model", model, "--port", str(free_port()), "--kv-port",
                str(free_port()), "--kv-transport", transport, "--num-threads", str(threads),
                "--num-kv-blocks", "1024"]
        services[role] = launch_service(f"{role}-worker", args)
    for service in services.values():
        service.wait_ready()
    return services


def _bench_model(folder: str) -> str:
    from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model

    return str(
        make_tiny_model(
            Path(folder) / "bench",
            TinyModelSpec.preset("llama", "bench", max_position_embeddings=4096)))


def run(args: argparse.Namespace) -> int:
    machine = machine_info()
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or _bench_model(tmp)
        for mode in MODES:
            services = _start(mode, model, args.kv_transport)
            try:
                decode = services.get("decode", services.get("mixed")).address
                prefill = services["prefill"].address if "prefill" in services else None
                asyncio.run(_measure(args, decode, prefill, False, f"{mode}-warmup"))
                results[mode] = {
                    phase: asyncio.run(
                        _measure(args, decode, prefill, phase == "long prompts", f"{mode}-{phase}"))
                    for phase in ("alone", "long prompts")
                }
            finally:
                for service in services.values():
                    service.terminate()
    print(_table(results))
    if args.output_json:
        arguments = {k: str(v) for k, v in vars(args).items() if k != "func"}
        doc = {"machine": machine, "args": arguments, "results": results}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        f"{'mode':<15}{'phase':<14}{'ITL p50 ms':>11}{'ITL p99 ms':>11}{'ITL max ms':>11}"
        f"{'long served':>12}"
    ]
    for mode, phases in results.items():
        for phase, r in phases.items():
            lines.append(f"{mode:<15}{phase:<14}{r['itl_p50_ms']:>11.1f}{r['itl_p99_ms']:>11.1f}"
                         f"{r['itl_max_ms']:>11.1f}{r['long_prompts_served']:>12}")
        ratio = phases["long prompts"]["itl_p99_ms"] / phases["alone"]["itl_p99_ms"]
        lines.append(f"{mode:<15}{'p99 ratio':<14}{ratio:>11.2f}x")
    return "\n".join(lines)

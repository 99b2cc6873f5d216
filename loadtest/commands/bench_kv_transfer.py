"""`baton bench kv-transfer`: the KV transports against each other, between two processes on this
machine, over host caches (`--device cpu`: NIXL and gRPC) or GPU caches (`--device cuda`: NIXL over
UCX's CUDA transports and the direct CUDA IPC transport; gRPC works too, through the host).

A child process plays the prefill worker (its cache, its NIXL agent, a gRPC server with PullKV);
this process plays the decode worker and READs hand-offs of growing size into random local blocks
from random remote blocks, as a paged allocator leaves them. The first read of every size is checked
byte for byte (by digest against the child's own) and not timed; it also brings up the connection.

`--kv-cache-layout NHD HND` runs everything once per in-block order of both caches, and `--tp A:B`
reads, over NIXL, what decode rank 0 of a pool at TP=B reads from a pool at TP=A (each prefill rank
played by the one child, kv_head_reads.py), so the piece counts and GB/s of the two orders compare;
`--count-only` prints the pieces per decode rank without moving anything.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from baton.loadtest.bench.kv_head_reads import TPPair, count_report, piece_count
from baton.loadtest.bench.kv_loopback import (CacheShape, SourceProcess, SourceSpec, blocks_digest,
                                              empty_cache, heads_digest)
from baton.loadtest.bench.throughput import machine_info
from baton.services.common.process import free_port
from baton.services.engine.kv.layout import KVLayout, block_runs, byte_view
from baton.services.worker.kv_transfer import KVTransport, make_transport
from baton.services.worker.kv_transfer.base import KVPeer

DEFAULT_SIZES = (1, 4, 16, 64, 256, 1024)
TRANSPORTS = ("nixl", "grpc", "cuda_ipc")
DEFAULT_TRANSPORTS = {"cpu": ["nixl", "grpc"], "cuda": ["nixl", "cuda_ipc"]}
# Named cache shapes: (layers, block size, KV heads, head dim, dtype).
LAYOUTS = {"llama-8b": (32, 16, 8, 128, "bfloat16"), "llama-70b": (80, 16, 8, 128, "bfloat16")}


@dataclass
class SizeResult:
    transport: str
    blocks: int
    bytes: int
    p50_ms: float
    p99_ms: float
    gb_per_s: float  # bytes / p50 latency
    verified: bool
    order: str = "NHD"  # both caches' in-block order
    pieces: int = 0  # address ranges one read moves (per decode rank under --tp)


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "kv-transfer",
        help="KV hand-off latency and bandwidth: NIXL against gRPC, two processes on loopback",
        description="Reads hand-offs of each size from a child process over each transport. The "
                    "default block is one Llama-3.1-8B (layer, block): 16 tokens x 8 KV heads x "
                    "128 dims x bf16, K and V = 64 KiB."
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), metavar="N",
                        help="blocks per hand-off [default: 1 4 16 64 256 1024]")
    parser.add_argument(
        "--layout", choices=sorted(LAYOUTS), default=None,
        help="a named cache shape; llama-8b: 32 layers, 8 KV heads x 128 dims, 16-token blocks, "
             "bf16 (overrides the four shape flags below)")
    parser.add_argument(
        "--num-layers", type=int, default=8,
        help="layers per block (Llama-3.1-8B has 32; 8 keeps two 1,024-block caches at 512 MiB "
             "each) [default: 8]")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block [default: 16]")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads [default: 8]")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension [default: 128]")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where both caches live [default: cpu]")
    parser.add_argument(
        "--blocks", choices=("random", "consecutive"), default="random",
        help="which blocks each read moves: scattered on both sides, or one run (coalesced into "
             "one range per layer) [default: random]")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed reads per size and transport [default: 10]")
    parser.add_argument("--transports", choices=TRANSPORTS, nargs="+", default=None,
                        help="[default: nixl grpc on cpu, nixl cuda_ipc on cuda]")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds allowed per read [default: 60]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-cache-layout", choices=("NHD", "HND"), nargs="+", default=["NHD"],
        help="in-block order of both caches; several: one run each, side by side [default: NHD]")
    parser.add_argument(
        "--tp", type=_tp_pair, default=TPPair(1, 1), metavar="PREFILL:DECODE",
        help="read decode rank 0's KV heads of a pool at TP=DECODE from one at TP=PREFILL (nixl "
             "only; each cache holds its rank's heads of --kv-heads) [default: 1:1, whole blocks]")
    parser.add_argument(
        "--count-only", type=int, default=None, metavar="TOKENS",
        help="print the pieces per decode rank of a hand-off of this many tokens for each pair "
             "of orders, and move nothing")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write every figure and the machine here")
    parser.set_defaults(func=run_kv_transfer)


def _tp_pair(text: str) -> TPPair:
    try:
        return TPPair.parse(text)
    except ValueError as e:  # argparse shows only this type's message
        raise argparse.ArgumentTypeError(str(e)) from e


def _check_args(args: argparse.Namespace) -> None:
    if min(args.sizes) < 1 or args.repeats < 1 or args.num_layers < 1:
        raise ValueError("--sizes, --repeats and --num-layers must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA device, and torch sees none")
    if args.transports is None:
        args.transports = (["nixl"] if args.tp.prefill != args.tp.decode else
                           DEFAULT_TRANSPORTS[args.device])
    if "cuda_ipc" in args.transports and args.device != "cuda":
        raise ValueError("the cuda_ipc transport needs --device cuda")
    if args.layout is not None:
        args.num_layers, args.block_size, args.kv_heads, args.head_dim, args.dtype = LAYOUTS[
            args.layout]
    if args.tp.prefill != args.tp.decode and set(args.transports) != {"nixl"}:
        raise ValueError("--tp across sizes reads head slices over nixl only: add "
                         "--transports nixl")


def run_kv_transfer(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
    except ValueError as e:
        print(f"baton bench kv-transfer: error: {e}", file=sys.stderr)
        return 2
    counts = count_report(args.num_layers, args.block_size, args.kv_heads, args.head_dim,
                          getattr(torch, args.dtype).itemsize, args.tp,
                          args.count_only or max(args.sizes) * args.block_size)
    if args.count_only is not None:
        print("\n".join(counts))
        return 0
    results: list[SizeResult] = []
    notified: dict[str, int] = {}
    for order in args.kv_cache_layout:
        results += _run_order(args, order, notified)
    if args.tp.prefill != args.tp.decode:
        print("\n".join(counts))
    print(format_table(results, [(kind, order) for order in args.kv_cache_layout
                                 for kind in args.transports]))
    for kind, count in notified.items():
        print(f"{kind}: the source was notified of {count} of "
              f"{len(args.sizes) * (args.repeats + 1)} reads")
    if args.output_json is not None:
        doc = {
            "args": {
                k: str(v) if isinstance(v, (Path, TPPair)) else v
                for k, v in vars(args).items() if k != "func"
            }, "machine": machine_info(), "counts": counts, "notified": notified,
            "block_nbytes": results[0].bytes // (args.num_layers * results[0].blocks),
            "results": [asdict(r) for r in results]
        }
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r.verified for r in results) else 1


def _run_order(args: argparse.Namespace, order: str, notified: dict[str, int]) -> list[SizeResult]:
    """Every transport and size with both caches in `order`."""
    src_heads, dst_heads = args.tp.heads(args.kv_heads)
    shape = CacheShape(args.num_layers, max(args.sizes), args.block_size, src_heads,
                       args.head_dim, args.dtype, order)
    local_shape = CacheShape(args.num_layers, max(args.sizes), args.block_size, dst_heads,
                             args.head_dim, args.dtype, order)
    print(f"{args.device} {order} caches; block: {shape.block_nbytes()} bytes per (layer, block), "
          f"{shape.num_layers} layers; {shape.num_blocks} blocks per cache; {args.repeats} timed "
          "reads per size", flush=True)
    source = SourceProcess(
        SourceSpec(shape, args.seed, f"bench-src-{free_port()}", free_port(), free_port(),
                   args.device, free_port(), tuple(args.transports))).start()
    local = empty_cache(local_shape, args.device).zero_()
    results: list[SizeResult] = []
    try:
        for kind in args.transports:
            transport = make_transport(kind, local, f"bench-dst-{free_port()}", "127.0.0.1",
                                       0 if kind == "grpc" else free_port(), metrics=False)
            try:
                # labelled with the order asked for: a cache of one KV head is both
                results += [replace(_measure(transport, source, local, n, args), order=order)
                            for n in args.sizes]
            finally:
                transport.close()
            if args.tp.prefill == args.tp.decode:
                key = kind if len(args.kv_cache_layout) == 1 else f"{kind} {order}"
                notified[key] = _count_notifications(
                    source, kind, len(args.sizes) * (args.repeats + 1))
    finally:
        source.stop()
    return results


def _read_once(transport: KVTransport, peer: KVPeer, blocks: tuple[list[int], list[int]],
               label: str, args: argparse.Namespace) -> int:
    """One hand-off: a whole-block read, or under --tp each head slice of decode rank 0."""
    if args.tp.prefill == args.tp.decode:
        return transport.read(peer, *blocks, label.encode(), args.timeout).num_bytes
    return sum(transport.read_heads(peer, *blocks, part, args.timeout).num_bytes
               for part in args.tp.reads(args.kv_heads))


def _verified(source: SourceProcess, local: torch.Tensor, remote_blocks: list[int],
              local_blocks: list[int], args: argparse.Namespace) -> bool:
    if args.tp.prefill == args.tp.decode:
        return blocks_digest(local, local_blocks) == source.digest(remote_blocks)
    return all(heads_digest(local, local_blocks, part.dst, part.count)
               == source.heads_digest(remote_blocks, part.src, part.count)
               for part in args.tp.reads(args.kv_heads))


def _pieces(local: torch.Tensor, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
            args: argparse.Namespace) -> int:
    layout = KVLayout.of(local)
    if args.tp.prefill != args.tp.decode:
        return piece_count(layout, peer.layout, args.tp.reads(args.kv_heads), len(local_blocks))
    runs = len(block_runs(remote_blocks, local_blocks))
    return layout.num_layers * runs


def _measure(transport: KVTransport, source: SourceProcess, local: torch.Tensor, n: int,
             args: argparse.Namespace) -> SizeResult:
    rng = random.Random(args.seed * 7919 + n)
    blocks = pick_blocks(rng, args.blocks, n, source.spec.shape.num_blocks, local.shape[1])
    peer = source.peers[transport.name]
    # so the check below cannot pass on an earlier transport's bytes
    byte_view(local)[:, blocks[1]] = 0
    if local.is_cuda:
        # NIXL writes through its own engine, outside torch's streams
        torch.cuda.synchronize(local.device)
    num_bytes = _read_once(transport, peer, blocks, f"bench-{n}-check", args)
    verified = _verified(source, local, *blocks, args)
    latencies = []
    for i in range(args.repeats):
        start = time.perf_counter()
        _read_once(transport, peer, blocks, f"bench-{n}-{i}", args)
        latencies.append(time.perf_counter() - start)
    p50, p99 = np.percentile(latencies, [50, 99])
    return SizeResult(transport.name, n, num_bytes, p50 * 1e3, p99 * 1e3, num_bytes / p50 / 1e9,
                      verified, pieces=_pieces(local, peer, *blocks, args))


def pick_blocks(rng: random.Random, pattern: str, n: int, remote_total: int,
                local_total: int) -> tuple[list[int], list[int]]:
    """`random`: n distinct blocks anywhere on each side, as a fragmented allocator leaves them;
    `consecutive`: one run of n on each side, at a random start, as a fresh prompt gets them (one
    range per layer)."""
    if pattern == "consecutive":
        remote, local = rng.randrange(remote_total - n + 1), rng.randrange(local_total - n + 1)
        return list(range(remote, remote + n)), list(range(local, local + n))
    return rng.sample(range(remote_total), n), rng.sample(range(local_total), n)


def _count_notifications(source: SourceProcess, kind: str, expected: int,
                         wait_s: float = 5.0) -> int:
    """NIXL notifications arrive asynchronously after the READ completes, so give the last ones a
    moment."""
    count, deadline = 0, time.monotonic() + wait_s
    while True:
        count += len(source.notifications()[kind])
        if count >= expected or time.monotonic() >= deadline:
            return count
        time.sleep(0.05)


def format_table(results: list[SizeResult], columns: list[tuple[str, str]]) -> str:
    """A row per size; per (transport, order) column: p50, p99, GB/s and pieces per read."""
    by_key = {(r.transport, r.order, r.blocks): r for r in results}
    sizes = sorted({r.blocks for r in results})
    labels = [kind if len({o for _, o in columns}) == 1 else f"{kind} {order}"
              for kind, order in columns]
    header = f"{'blocks':>7}{'bytes':>13}"
    for label in labels:
        header += (f"{label + ' p50 ms':>16}{label + ' p99 ms':>16}{label + ' GB/s':>14}"
                   f"{label + ' pieces':>16}")
    compare = len(columns) == 2
    if compare:
        header += f"{'  ' + labels[1] + '/' + labels[0] + ' p50':>24}"
    lines = [header]
    for n in sizes:
        row = [by_key[(kind, order, n)] for kind, order in columns]
        line = f"{n:>7}{row[0].bytes:>13,}"
        for r in row:
            line += (f"{r.p50_ms:>16.3f}{r.p99_ms:>16.3f}{r.gb_per_s:>14.3f}{r.pieces:>16,}"
                     + ("" if r.verified else " UNVERIFIED"))
        if compare:
            line += f"{row[1].p50_ms / row[0].p50_ms:>23.1f}x"
        lines.append(line)
    return "\n".join(lines)

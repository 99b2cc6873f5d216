"""`baton bench decode-step`: per-step time of pure decode steps at given batch sizes and contexts,
beside the HBM floor computed from the checkpoint and the device's bandwidth."""
from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
from pathlib import Path

from baton.loadtest.bench.decode import (default_bandwidth_gbps, format_rows, kv_bytes_per_token,
                                         measure, row_dict, weight_bytes_per_step)
from baton.loadtest.bench.throughput import machine_info
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.kv_cache import KVCacheTooLarge
from baton.services.engine.llm_engine import LLMEngine

NAME = "baton bench decode-step"


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "decode-step", help="pure decode step time against the HBM floor",
        description="Times pure decode steps (no prefill in them) at each batch size and context, "
                    "and prints the floor: weights read once plus every sequence's KV, at the "
                    "device's memory bandwidth.")
    parser.add_argument("--batch-sizes", default="1,32,128",
                        help="comma-separated [default: 1,32,128]")
    parser.add_argument(
        "--context", type=int, nargs="+", default=[2048],
        help="tokens already in each sequence's cache; several values run each [default: 2048]")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per point [default: 20]")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps per point first [default: 3]")
    parser.add_argument(
        "--bandwidth-gbps", type=float, default=None,
        help="memory bandwidth for the floor [default: a table by GPU name; on a CPU the floor is "
             "n/a unless given]")
    parser.add_argument("--graphs", choices=("on", "off"), default="on",
                        help="CUDA graphs for the decode steps (off = enforce_eager) [default: on]")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write rows, floor inputs and machine here")
    add_settings_arguments(parser, EngineConfig,
                           exclude=("enforce_eager", "enable_prefix_caching", "engine"))
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace, batches: list[int]) -> EngineConfig:
    config = settings_from_args(EngineConfig, args)
    return config.model_copy(update={
        "enforce_eager": args.graphs == "off", "enable_prefix_caching": False,
        "max_num_seqs": max(max(batches), config.max_num_seqs),
        "cuda_graph_max_batch_size": max(max(batches), config.cuda_graph_max_batch_size),
        "max_num_batched_tokens": max(config.max_num_batched_tokens, max(batches))})


def _captured(engine: LLMEngine) -> bool:
    return engine.runner.graphs is not None and engine.runner.graphs.captured


def run(args: argparse.Namespace) -> int:
    try:
        batches = [int(b) for b in args.batch_sizes.split(",")]
        if min(batches) < 1 or min(args.context) < 1 or args.steps < 1:
            raise ValueError("batch sizes, contexts and --steps must be at least 1")
    except ValueError as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    machine = machine_info()
    per_seq = max(args.context) + args.warmup + args.steps + 2
    try:
        config = _config(args, batches)
        wanted = max(batches) * -(-per_seq // config.block_size)
        engine = LLMEngine(
            config,
            kv_blocks_wanted=None if config.num_kv_blocks or config.kv_cache_memory_gib else wanted)
    except KVCacheTooLarge as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    gc.freeze()  # as a worker does once started (services/worker/server.py)
    bandwidth = args.bandwidth_gbps or default_bandwidth_gbps(engine.device)
    weights = weight_bytes_per_step(engine.runner.model)
    print(
        f"device {engine.device} ({machine['cuda'] or machine['processor'] or 'cpu'}), dtype "
        f"{engine.dtype}, "
        f"graphs {'on' if _captured(engine) else 'off'}, "
        f"weights read per step {weights / 1e6:.1f} MB, KV {kv_bytes_per_token(engine)} "
        "B/token, bandwidth "
        f"{'n/a' if bandwidth is None else f'{bandwidth:g} GB/s'}", flush=True)
    rows = []
    try:
        for context in args.context:
            for batch in batches:
                rows.append(
                    measure(engine, batch, context, args.steps, args.warmup, bandwidth,
                            engine.config.seed))
    except ValueError as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if args.output_json is not None:
        doc = {
            "command": shlex.join(sys.argv), "machine": machine, "device": str(engine.device),
            "dtype": str(engine.dtype), "graphs": _captured(engine), "bandwidth_gbps": bandwidth,
            "weight_bytes_per_step": weights, "kv_bytes_per_token": kv_bytes_per_token(engine),
            "num_kv_blocks": engine.blocks.num_blocks, "rows": [row_dict(r) for r in rows]
        }
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0

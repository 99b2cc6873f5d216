"""`baton bench kv-tiers`: multi-turn conversations on a worker whose device cache is far smaller
than their KV, with no tier, a host-memory tier, and a small host tier over a disk tier, side by
side in one run (loadtest/bench/kv_tiers.py)."""
from __future__ import annotations

import argparse
import gc
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from baton.loadtest.bench.kv_tiers import (TierRun, Turn, conversations, format_runs,
                                           run_conversations, summary)
from baton.loadtest.bench.throughput import machine_info, special_token_ids
from baton.loadtest.traces import TRACE_FILES, read_trace
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

NAME = "baton bench kv-tiers"


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser("kv-tiers", help="multi-turn conversations with and without KV "
                              "tiers below a small device cache", description=__doc__)
    parser.add_argument("--model", default=None,
                        help="checkpoint folder [default: a fresh bench-preset model]")
    parser.add_argument("--trace", choices=tuple(TRACE_FILES), default="azure-conv")
    parser.add_argument("--traces-dir", default=None, help="trace folder")
    parser.add_argument("--trace-scale", type=float, default=8.0,
                        help="every trace length is divided by this [default: 8]")
    parser.add_argument("--conversations", type=int, default=16, help="[default: 16]")
    parser.add_argument("--turns", type=int, default=4, help="turns each [default: 4]")
    parser.add_argument("--in-flight", type=int, default=4,
                        help="turns served at once (closed loop) [default: 4]")
    parser.add_argument("--num-kv-blocks", type=int, default=128,
                        help="device cache, in blocks of --block-size [default: 128]")
    parser.add_argument("--block-size", type=int, default=16, help="[default: 16]")
    parser.add_argument("--host-gib", type=float, default=1.0,
                        help="host tier of the host-only system [default: 1]")
    parser.add_argument("--small-host-gib", type=float, default=0.02,
                        help="host tier above the disk tier [default: 0.02]")
    parser.add_argument("--disk-dir", default=None,
                        help="disk tier folder [default: a temporary folder]")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--repeat", type=int, default=2,
                        help="rounds of all systems, each round in a rotated order, so that a "
                             "shared machine's load swings fall on every system [default: 2]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", type=Path, default=None)
    parser.set_defaults(func=run)


def _bench_model(folder: str) -> str:
    from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model

    spec = TinyModelSpec.preset("llama", "bench", max_position_embeddings=8192)
    return str(make_tiny_model(Path(folder) / "bench", spec))


def _systems(args: argparse.Namespace, disk_dir: str) -> dict[str, dict[str, object]]:
    return {
        "device only": {},
        "host tier": {"kv_offload_host_gib": args.host_gib},
        "host + disk": {"kv_offload_host_gib": args.small_host_gib,
                        "kv_offload_disk_dir": disk_dir, "kv_offload_disk_gib": 4.0},
    }


def _engine(args: argparse.Namespace, model: str, tiers: dict[str, object]) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=model, num_kv_blocks=args.num_kv_blocks, block_size=args.block_size,
        max_num_seqs=args.in_flight, num_threads=args.threads, seed=args.seed, **tiers))


def _convs(args: argparse.Namespace, model: str) -> list[list[Turn]]:
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = read_trace(args.trace, args.traces_dir, args.conversations * args.turns)
    return conversations(rows, args.conversations, args.turns, args.trace_scale, len(tokenizer),
                         special_token_ids(tokenizer), args.seed)


def _median_run(runs: list[TierRun]) -> TierRun:
    return sorted(runs, key=lambda r: r.ttft_p(0.5))[(len(runs) - 1) // 2]


def run(args: argparse.Namespace) -> int:
    machine = machine_info()
    runs: list[TierRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or _bench_model(tmp)
        try:
            convs = _convs(args, model)
        except (ValueError, FileNotFoundError) as e:
            print(f"{NAME}: error: {e}", file=sys.stderr)
            return 2
        # Warm-up, untimed: the device-only system once over the same conversations (the CPU
        # GEMM libraries set up each new shape once per process).
        run_conversations(_engine(args, model, {}), convs, args.in_flight, "warm-up")
        gc.freeze()
        systems = list(_systems(args, args.disk_dir or str(Path(tmp) / "disk")).items())
        for rep in range(args.repeat):
            for name, tiers in systems[rep % len(systems):] + systems[:rep % len(systems)]:
                if "kv_offload_disk_dir" in tiers:
                    shutil.rmtree(str(tiers["kv_offload_disk_dir"]), ignore_errors=True)
                engine = _engine(args, model, tiers)
                runs.append(run_conversations(engine, convs, args.in_flight, name))
                engine.close()
                print(format_runs(runs[-1:]).splitlines()[-1], flush=True)
    runs.sort(key=lambda r: [n for n, _ in systems].index(r.name))
    median = [_median_run([r for r in runs if r.name == n]) for n, _ in systems]
    same = all(r.outputs == runs[0].outputs for r in runs)
    print(f"every run, by system:\n{format_runs(runs)}")
    print(f"per system, the run with the median TTFT p50:\n{format_runs(median)}")
    print(f"greedy outputs identical across systems and runs: {same}")
    if args.output_json is not None:
        doc = {"command": shlex.join(sys.argv), "machine": machine, "outputs_identical": same,
               "runs": [summary(r) for r in runs], "median": [summary(r) for r in median]}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if same else 1

"""`baton bench lora`: decode step time with 1, 8 and 32 distinct LoRA adapters in the batch beside
the base model alone, in the same engine and run (random adapters in PEFT's layout, made for the
model first)."""
from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from baton.loadtest.bench.lora import format_rows, make_adapters, measure
from baton.loadtest.bench.throughput import machine_info
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

NAME = "baton bench lora"


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "lora", help="decode steps with many LoRA adapters in the batch against the base model",
        description="Times decode steps of one batch whose sequences use N distinct LoRA adapters "
                    "(round robin), and of the same batch on the base model, in one engine.")
    parser.add_argument("--adapters", default="1,8,32",
                        help="distinct adapters per batch, comma-separated [default: 1,8,32]")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step [default: 32]")
    parser.add_argument("--context", type=int, default=256,
                        help="tokens in each sequence's cache [default: 256]")
    parser.add_argument("--rank", type=int, default=16, help="adapters' rank [default: 16]")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per point [default: 20]")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first [default: 3]")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each point is measured, alternating, best median kept "
                             "[default: 3]")
    parser.add_argument("--output-json", type=Path, default=None, help="write the rows here")
    add_settings_arguments(parser, EngineConfig,
                           exclude=("lora_modules", "enable_lora", "max_loras", "max_cpu_loras",
                                    "enable_prefix_caching", "engine"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    counts = [int(n) for n in args.adapters.split(",")]
    if min(counts) < 1 or args.batch < max(counts) or args.steps < 1:
        print(f"{NAME}: error: adapter counts must be in [1, --batch] and --steps at least 1",
              file=sys.stderr)
        return 2
    config = settings_from_args(EngineConfig, args)
    if config.model is None:
        print(f"{NAME}: error: --model is required (baton make-tiny-model DIR --preset bench)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="baton-bench-lora-") as root:
        modules = make_adapters(Path(config.model), Path(root), max(counts), args.rank)
        config = config.model_copy(update={
            "lora_modules": modules, "enable_lora": True, "max_loras": max(counts),
            "max_cpu_loras": max(counts), "max_lora_rank": max(config.max_lora_rank, args.rank),
            "enable_prefix_caching": False, "max_num_seqs": max(config.max_num_seqs, args.batch)})
        engine = LLMEngine(config)
        gc.freeze()
        best: dict[int, object] = {}
        for _ in range(args.rounds):
            for n in [0, *counts]:
                row = measure(engine, n, args.batch, args.context, args.steps, args.warmup)
                if n not in best or row.median_ms < best[n].median_ms:
                    best[n] = row
    rows = [best[n] for n in [0, *counts]]
    for row in rows:
        row.vs_base = row.median_ms / rows[0].median_ms
    print(f"device {engine.device}, dtype {engine.dtype}, rank {args.rank} on "
          f"q/k/v/o/gate/up/down, threads {config.num_threads or 'default'}")
    print(format_rows(rows))
    if args.output_json is not None:
        args.output_json.write_text(json.dumps({
            "command": shlex.join(sys.argv), "machine": machine_info(),
            "device": str(engine.device), "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    return 0

"""`baton bench tp`: prefill and decode step time, tokens/s and the collectives' share of the step
at each tensor-parallel size (default 1, 2, 4), side by side in one run."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from baton.loadtest.bench.throughput import machine_info
from baton.loadtest.bench.tp import TPRow, format_rows, measure_decode, measure_prefill, row_dict
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

NAME = "baton bench tp"


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "tp", help="step time and tokens/s at each tensor-parallel size",
        description="Times prefill steps (one fresh prompt each) and pure decode steps at each "
                    "tensor-parallel size, with the share of rank 0's step spent in the model's "
                    "collectives. Each size loads the model afresh; loading is not timed.")
    parser.add_argument("--sizes", default="1,2,4",
                        help="comma-separated tensor-parallel sizes [default: 1,2,4]")
    parser.add_argument("--batch-sizes", default="1,16",
                        help="decode batch sizes, comma-separated [default: 1,16]")
    parser.add_argument("--context", type=int, default=256,
                        help="tokens in each decode sequence's cache [default: 256]")
    parser.add_argument("--prefill-tokens", type=int, default=512,
                        help="prompt tokens of each timed prefill step [default: 512]")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per point [default: 20]")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps per point first [default: 3]")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write rows and machine here")
    add_settings_arguments(parser, EngineConfig,
                           exclude=("tensor_parallel_size", "enable_prefix_caching", "engine"))
    parser.set_defaults(func=run)


def _rows_for(config: EngineConfig, tp: int, args: argparse.Namespace,
              batches: list[int]) -> list[TPRow]:
    engine = LLMEngine(config.model_copy(update={"tensor_parallel_size": tp}))
    try:
        rows = [measure_prefill(engine, tp, args.prefill_tokens, args.steps, args.warmup)]
        rows += [measure_decode(engine, tp, b, args.context, args.steps, args.warmup)
                 for b in batches]
    finally:
        engine.close()
    print(f"tp={tp}: measured", file=sys.stderr, flush=True)
    return rows


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        batches = [int(b) for b in args.batch_sizes.split(",")]
        if min(sizes + batches) < 1 or min(args.steps, args.context, args.prefill_tokens) < 1:
            raise ValueError("sizes, batch sizes, --steps, --context and --prefill-tokens must "
                             "be at least 1")
        config = settings_from_args(EngineConfig, args).model_copy(update={
            "enable_prefix_caching": False,
            "max_num_seqs": max(max(batches), 1),
            "max_num_batched_tokens": max(args.prefill_tokens, max(batches))})
        rows = []
        for tp in sizes:
            rows += _rows_for(config, tp, args, batches)
    except ValueError as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if args.output_json is not None:
        doc = {"command": shlex.join(sys.argv), "machine": machine_info(),
               "rows": [row_dict(r) for r in rows]}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0

"""`baton bench spec`: speculative decoding against none, side by side in one run (TPOT and
tokens/s at each batch size, on a repeating and a non-repeating workload)."""
from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
from pathlib import Path

from baton.loadtest.bench.copy_model import cached_copy_model
from baton.loadtest.bench.spec import FIRST_TOKEN, WORKLOADS, format_rows, measure, row_dict
from baton.loadtest.bench.throughput import machine_info
from baton.services.common.sampling_params import SamplingParams
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.speculation.config import parse_speculative_config

NAME = "baton bench spec"
DEFAULT_SPEC = ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
                '"prompt_lookup_max": 4, "disable_by_batch_size": 32}')


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "spec", help="speculative decoding against none (TPOT, tokens/s)",
        description="Runs the same greedy requests with and without speculative decoding, "
                    "alternating, at each batch size on each workload, and prints TPOT and "
                    "tokens/s side by side with the acceptance rate. A random-weight model never "
                    "repeats its prompt, so without --model the bench runs a tiny Llama trained "
                    "to copy (baton.loadtest.bench.copy_model: trained on first use, a few "
                    "minutes on a CPU, then cached in the temp dir).")
    parser.add_argument("--batch-sizes", default="1,8,64", help="comma-separated [default: 1,8,64]")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)} [default: all]")
    parser.add_argument("--prompt-len", type=int, default=96, help="tokens [default: 96]")
    parser.add_argument("--output-len", type=int, default=64, help="tokens [default: 64]")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each point with and without; medians [default: 3]")
    parser.add_argument("--spec", default=DEFAULT_SPEC,
                        help=f"the speculative config measured [default: {DEFAULT_SPEC}]")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write rows and machine here")
    add_settings_arguments(parser, EngineConfig, exclude=("speculative_config", "engine"))
    parser.set_defaults(func=run)


def _engines(args: argparse.Namespace, batches: list[int]) -> tuple[LLMEngine, LLMEngine]:
    config = settings_from_args(EngineConfig, args)
    if config.model is None:
        config = config.model_copy(update={"model": str(cached_copy_model())})
    per_seq = -(-(args.prompt_len + args.output_len + 32) // config.block_size)
    config = config.model_copy(update={
        "max_num_seqs": max(max(batches), config.max_num_seqs),
        "num_kv_blocks": config.num_kv_blocks or max(batches) * per_seq + 64})
    # The config's own check, which model_copy would skip: a bad --spec is refused here.
    parse_speculative_config(args.spec)
    return LLMEngine(config), LLMEngine(config.model_copy(update={"speculative_config": args.spec}))


def run(args: argparse.Namespace) -> int:
    try:
        batches = [int(b) for b in args.batch_sizes.split(",")]
        workloads = args.workloads.split(",")
        if min(batches) < 1 or args.repeats < 1 or set(workloads) - set(WORKLOADS):
            raise ValueError(f"batch sizes and --repeats must be at least 1, workloads of "
                             f"{WORKLOADS}")
        off, on = _engines(args, batches)
    except ValueError as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    gc.freeze()
    machine = machine_info()
    print(f"model {off.model_dir.name}, device {off.device}, spec {args.spec}", flush=True)
    for engine in (off, on):  # warm-up, untimed
        engine.generate([[FIRST_TOKEN + i] * 8 for i in range(2)],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    rows = []
    for workload in workloads:
        for batch in batches:
            rows.append(measure(off, on, workload, batch, args.prompt_len, args.output_len,
                                args.repeats, off.config.seed))
            print(format_rows(rows[-1:]).splitlines()[1], flush=True)
    print(format_rows(rows))
    if args.output_json is not None:
        doc = {"command": shlex.join(sys.argv), "machine": machine, "spec": args.spec,
               "rows": [row_dict(r) for r in rows]}
        args.output_json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0

"""`baton bench <kind>`: benchmarks, one subcommand each.

A new kind (kv-transfer, router, gateway) gets its own module with a `register(kinds)` and one call
in `register` below; `bench` itself only owns the subparser the kinds hang from.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from baton.loadtest.bench.throughput import (EngineShape, ThroughputResult, format_table,
                                             kv_blocks_for, machine_info, report, run_baton, run_hf,
                                             special_token_ids, warmup_workload)
from baton.loadtest.traces import TRACE_FILES, TRACES_DIR_ENV
from baton.loadtest.workloads import (Request, random_workload, shared_prefix_workload, summarize,
                                      trace_workload)
from baton.services.checkpoints.tiny_model import embedded_model_path
from baton.loadtest.commands import (bench_decode_step, bench_isolation, bench_kv_tiers,
                                     bench_lora, bench_overload, bench_spec, bench_tp)
from baton.loadtest.commands.bench_gateway import register as register_gateway
from baton.loadtest.commands.bench_kv_transfer import register as register_kv_transfer
from baton.loadtest.commands.bench_router import register as register_router
from baton.services.cli.engine_runner import sim_runner_for
from baton.services.common.model_config import load_config
from baton.services.common.sampling_params import StructuredOutput
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.common.structured_spec import check_structured
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.kv_cache import KVCacheTooLarge
from baton.services.engine.llm_engine import LLMEngine

# The default workload is the headline benchmark: inputs uniform in [32, 256], outputs in [16, 256].
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, DEFAULT_RANGE_RATIO = 144, 136, (0.7778, 0.8824)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks",
                                   description="Benchmarks; see each kind's --help.")
    kinds = parser.add_subparsers(dest="bench_kind", required=True, metavar="KIND")
    register_throughput(kinds)
    register_kv_transfer(kinds)
    register_router(kinds)
    register_gateway(kinds)
    bench_isolation.register(kinds)
    bench_decode_step.register(kinds)
    bench_overload.register(kinds)
    bench_kv_tiers.register(kinds)
    bench_lora.register(kinds)
    bench_spec.register(kinds)
    bench_tp.register(kinds)


def register_throughput(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "throughput", help="offline throughput of the engine (optionally against transformers)",
        description="Offline throughput: all requests at once, greedy, EOS ignored so every "
                    "request generates exactly its output length. Model loading and a small "
                    "warm-up are not timed.")
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--workload", choices=("random", "shared-prefix", "trace"), default="random",
        help="random prompts; the same random prompts behind one shared prefix; or a public trace")
    w.add_argument("--num-prompts", type=int, default=128, help="requests [default: 128]")
    w.add_argument(
        "--input-len", type=int, default=DEFAULT_INPUT_LEN,
        help="mean prompt length (shared-prefix: of the part after the prefix) [default: 144]")
    w.add_argument("--output-len", type=int, default=DEFAULT_OUTPUT_LEN,
                   help="mean output length [default: 136]")
    w.add_argument(
        "--range-ratio", type=float, nargs="+", default=list(DEFAULT_RANGE_RATIO), metavar="R",
        help="lengths are uniform in [len*(1-R), len*(1+R)]; one R for both or input R then output "
             "R [default: 0.7778 0.8824, i.e. inputs 32-256 and outputs 16-256]")
    w.add_argument("--prefix-len", type=int, default=512,
                   help="shared-prefix: tokens shared by all [default: 512]")
    w.add_argument("--trace", choices=tuple(TRACE_FILES), default="mooncake-conv",
                   help="trace: which one")
    w.add_argument(
        "--trace-scale", type=float, default=16.0,
        help="trace: every length is divided by this (Mooncake needs a divisor of 512) "
             "[default: 16]"
    )
    w.add_argument(
        "--traces-dir", default=None,
        help=f"trace folder [default: ${TRACES_DIR_ENV}, else ../shared/traces beside "
             "the repository]")
    w.add_argument("--seed", type=int, default=0,
                   help="seed of the workload and of the engine's sampler")
    parser.add_argument(
        "--compare", choices=("hf", ), default=None,
        help="also run transformers' continuous batching on the same checkpoint and requests")
    parser.add_argument(
        "--json-schema", type=Path, default=None, metavar="FILE",
        help="constrain every request to this JSON schema (response_format json_schema), then run "
             "the same requests unconstrained at the lengths the constrained run produced")
    parser.add_argument("--output-json", type=Path, default=None,
                        help="write every figure, the command and the machine to this file")
    add_settings_arguments(parser, EngineConfig, exclude=("seed",))
    parser.set_defaults(func=run_throughput)


def _range_ratio(values: list[float]) -> float | tuple[float, float]:
    if len(values) > 2:
        raise ValueError("--range-ratio takes one or two values")
    return values[0] if len(values) == 1 else (values[0], values[1])


def build_workload(args: argparse.Namespace, vocab_size: int, avoid: set[int],
                   max_len: int) -> list[Request]:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    ratio = _range_ratio(args.range_ratio)
    if args.workload == "random":
        requests = random_workload(args.num_prompts, args.input_len, args.output_len, ratio,
                                   vocab_size, args.seed, avoid)
    elif args.workload == "shared-prefix":
        requests = shared_prefix_workload(args.num_prompts, args.prefix_len, args.input_len,
                                          args.output_len, ratio, vocab_size, args.seed, avoid)
    else:
        requests = trace_workload(args.trace, args.num_prompts, args.trace_scale, vocab_size,
                                  args.seed, avoid, max_len=max_len, traces_dir=args.traces_dir)
    longest = max(len(p) + n for p, n in requests)
    if longest > max_len:
        raise ValueError(f"a request needs {longest} tokens; the model's context is {max_len}")
    return requests


def _describe(args: argparse.Namespace, stats: dict[str, int | float]) -> str:
    shape = {
        "random": "random", "shared-prefix": f"shared-prefix ({args.prefix_len}-token prefix)",
        "trace": f"trace {args.trace} (lengths divided by {args.trace_scale:g})"
    }[args.workload]
    return (
        f"workload: {shape}, {stats['num_requests']} requests, seed {args.seed}; "
        f"input {stats['input_len_min']}-{stats['input_len_max']} (mean "
        f"{stats['input_len_mean']}), "
        f"output {stats['output_len_min']}-{stats['output_len_max']} (mean "
        f"{stats['output_len_mean']}) tokens"
    )


def _engine(args: argparse.Namespace, requests: list[Request]) -> LLMEngine:
    """Without an explicit KV size, the cache is sized to the work (transformers plans for attention
    over its whole cache, and both systems then get the same capacity), but never past what memory
    allows."""
    config = settings_from_args(EngineConfig, args)
    if config.num_kv_blocks is not None or config.kv_cache_memory_gib is not None:
        return LLMEngine(config, sim_runner=sim_runner_for(config))
    wanted = kv_blocks_for(requests, config.block_size)
    engine = LLMEngine(config, kv_blocks_wanted=wanted, sim_runner=sim_runner_for(config))
    if engine.runner.num_blocks < wanted:
        print(
            f"KV cache capped at the memory budget: {engine.runner.num_blocks} of the {wanted} "
            "blocks the "
            f"workload would hold at once; requests queue for room", flush=True)
    return engine


def _structured(args: argparse.Namespace) -> StructuredOutput | None:
    """--json-schema as a structured output; ValueError when it cannot be used."""
    if args.json_schema is None:
        return None
    if args.compare is not None:
        raise ValueError(
            "--json-schema runs its own comparison (constrained vs not); drop --compare")
    spec = StructuredOutput("json_schema", args.json_schema.read_text())
    check_structured(spec.kind, spec.value)
    return spec


def _run_engine(args: argparse.Namespace, requests: list[Request], warmup: list[Request],
                structured: StructuredOutput | None) -> tuple[list[ThroughputResult], EngineShape]:
    """The engine alone, or constrained and then unconstrained at the constrained lengths, each on a
    fresh engine so the second run finds no prompt in the first one's prefix cache."""
    engine = _engine(args, requests + warmup)
    shape = EngineShape.of(engine)
    results = [run_baton(engine, requests, warmup, structured)]
    del engine
    gc.collect()
    if structured is not None:
        same = [(prompt, n) for (prompt, _), n in zip(requests, results[0].output_lens)]
        results.append(run_baton(_engine(args, requests + warmup), same, warmup))
    return results, shape


def run_throughput(args: argparse.Namespace) -> int:
    machine = machine_info()  # before the run, so the load average is the one it started under
    model_dir = Path(args.model) if getattr(args, "model", None) else embedded_model_path()
    args.model = str(model_dir)
    tokenizer, model_config = AutoTokenizer.from_pretrained(str(model_dir)), load_config(model_dir)
    avoid = special_token_ids(tokenizer)
    try:
        requests = build_workload(
            args, model_config.vocab_size, avoid,
            getattr(args, "max_model_len", None) or model_config.max_position_embeddings)
        structured = _structured(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"baton bench throughput: error: {e}", file=sys.stderr)
        return 2
    warmup = warmup_workload(model_config.vocab_size, args.seed, avoid)
    stats = summarize(requests)
    print(_describe(args, stats), flush=True)
    try:
        results, shape = _run_engine(args, requests, warmup, structured)
    except KVCacheTooLarge as e:
        print(f"baton bench throughput: error: {e}", file=sys.stderr)
        return 2
    if args.compare == "hf":
        # Free the engine's KV cache first (_run_engine dropped it): on a GPU it holds most of the
        # memory transformers will ask for.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        results.append(run_hf(shape, requests, warmup))
    print(format_table(results))
    if args.output_json is not None:
        args_doc = {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items() if k != "func"
        }
        args.output_json.write_text(
            json.dumps(report(args_doc, machine, stats, results), indent=2) + "\n")
    return 0

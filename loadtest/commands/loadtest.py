"""`baton loadtest`: load any OpenAI-compatible server (Baton, vLLM, SGLang, `transformers serve`)
with a workload at a request rate or a concurrency, and report client-side TTFT, TPOT, ITL, E2E, SLO
attainment and goodput. `--sweep` steps the rate to find the highest one that still meets the SLO
for 90% of requests."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from baton.loadtest.scenarios import WORKLOADS, WorkloadSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("loadtest", help="load-test an OpenAI-compatible server",
                              description=__doc__)
    p.add_argument("--url", required=True,
                   help="base URL of the API, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="model name to request")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--no-ignore-eos", dest="ignore_eos", action="store_false",
        help="do not send ignore_eos (for servers that refuse unknown fields, e.g. "
             "`transformers serve`)"
    )
    p.add_argument("--workload", choices=WORKLOADS, default="synthetic")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop: mean requests per second")
    load.add_argument("--concurrency", type=int,
                      help="closed loop: users, each sending when its last answer ends")
    load.add_argument("--sweep", default=None,
                      help="open loop at each of these rates, e.g. 0.5,1,2,4")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of sending (per sweep point) [60]")
    p.add_argument(
        "--drain-timeout", type=float, default=60.0,
        help="seconds requests still running after --duration may take; then they count "
             "as failed [60]")
    p.add_argument("--arrivals", choices=("poisson", "gamma", "trace"), default=None,
                   help="open-loop arrivals [default: trace for trace workloads, else poisson]")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape: <1 burstier than Poisson [1]")
    p.add_argument(
        "--warmup", type=int, default=0, metavar="N",
        help="send N requests (from another seed) first and leave them out of the results [0]")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--output-json", default=None,
                   help="write the summaries and every request's timings here ('-': stdout)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument(
        "--server-metrics", default=None, metavar="URL",
        help="the server's Prometheus /metrics: also report its TTFT and ITL histogram quantiles")
    _workload_arguments(p)
    p.add_argument(
        "--block-size", type=int, default=16,
        help="the server's KV block size: the unlimited-cache hit-ratio bound is counted in its "
             "blocks [16]"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", default=None,
        help="checkpoint folder: its vocabulary and special ids shape the prompts [default: none]")
    p.add_argument("--vocab-size", type=int, default=512,
                   help="token ids are drawn below this [512]")
    p.add_argument(
        "--text-prompts", action="store_true",
        help="send prompts as text (decoded with --tokenizer), for servers that take no token ids")
    p.add_argument("--input-len", type=int, default=128,
                   help="synthetic: median prompt length [128]")
    p.add_argument("--output-len", type=int, default=64,
                   help="synthetic: median output length [64]")
    p.add_argument("--prefix-len", type=int, default=256,
                   help="shared-prefix: system prompt length [256]")
    p.add_argument("--length-scale", type=float, default=16.0,
                   help="traces: lengths divided by this [16]")
    p.add_argument("--max-len", type=int, default=2048,
                   help="prompt plus output at most this long [2048]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traces-dir", default=None,
                   help="folder of the public traces [../shared/traces]")


def _spec_and_prompts(args: argparse.Namespace):
    """The workload spec and how a request's prompt is sent (ids, or text for servers that need
    it)."""
    vocab, avoid, prompt_of = args.vocab_size, (), (lambda request: request.prompt)
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        vocab, avoid = len(tokenizer), tuple(tokenizer.all_special_ids)
        if args.text_prompts:
            prompt_of = lambda request: tokenizer.decode(request.prompt)
    elif args.text_prompts:
        raise SystemExit("--text-prompts needs --tokenizer")
    spec = WorkloadSpec(args.workload, vocab, input_len=args.input_len, output_len=args.output_len,
                        prefix_len=args.prefix_len, length_scale=args.length_scale,
                        max_len=args.max_len, seed=args.seed, avoid=avoid,
                        traces_dir=args.traces_dir)
    return spec, prompt_of


def run(args: argparse.Namespace) -> int:
    from baton.loadtest.session import LoadTest

    # One log line per request would drown the progress bar and the table.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    spec, prompt_of = _spec_and_prompts(args)
    test = LoadTest.from_args(args, spec, prompt_of)
    data = asyncio.run(
        test.sweep([float(r) for r in args.sweep.split(",")]) if args.sweep else test.single())
    if args.output_json:
        from baton.loadtest.report import write_json

        write_json(args.output_json, data)
    failures = sum(p["summary"]["failed"] for p in data.get("points", [data]))
    if failures:
        print(f"{failures} request(s) failed (neither answered nor refused)", file=sys.stderr)
    return 0

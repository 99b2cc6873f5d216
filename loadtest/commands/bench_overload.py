"""`baton bench overload`: admission control through the whole stack, at 1x, 2x and 3x a base rate,
on and off.

Each run starts a fresh stack (workers, router and gateway as separate processes, as `baton serve`
does) and sends an open-loop Poisson load through the gateway with the `openai`-compatible HTTP API,
the loadtest's client. "On" is the default router with the gateway sending each request's TTFT and
TPOT SLOs; "off" sends none and lifts the router queue's bounds. By default the workers run the sim
engine, whose timing model stands in for the forward
pass: every step costs a fixed part plus a cost per decode row, so the decode batch is what
saturates, as it does on the real CPU model; `--engine model` runs the checkpoint itself.

Per run it prints what the issue asks for: goodput (answered within both SLOs, per second of
sending), attainment, refusals with their latency from the client's send to its receipt of the
429/503, and late admissions (answered requests whose TTFT or TPOT missed its SLO). With `--tenants`
the load comes from API-key tenants at different priorities (bench_overload_tenants.py) and every
run prints a row per tenant.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import tempfile
from pathlib import Path

from baton.loadtest.bench.throughput import machine_info
from baton.loadtest.client import Target
from baton.loadtest.scenarios import WorkloadSpec
from baton.loadtest.session import LoadTest
from baton.loadtest.stats import SLO, percentiles
from baton.loadtest.commands import bench_overload_tenants as mix
from baton.services.common.process import ServiceProcess, free_port, launch_service

UNBOUNDED = "100000"  # "off": a queue size and age no run reaches
SIM_COST = ("--sim-step-base-seconds", "--sim-decode-seconds-per-sequence",
            "--sim-prefill-tokens-per-second")


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "overload", help="goodput and refusals through the whole stack at 1x-3x load, admission on "
                         "and off", description=__doc__)
    p.add_argument("--model", default=None,
                   help="checkpoint folder [default: the embedded tiny model]")
    p.add_argument("--engine", choices=("sim", "model"), default="sim",
                   help="workers' engine [sim]")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second at 1x [2.0]")
    p.add_argument("--loads", default="1,2,3", help="multiples of --rate to run [1,2,3]")
    p.add_argument("--admission", choices=("on", "off", "both"), default="both")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of sending per run [30]")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="then unanswered requests count as failed [60]")
    p.add_argument("--input-len", type=int, default=512,
                   help="median prompt length (long-tailed) [512]")
    p.add_argument("--output-len", type=int, default=64,
                   help="median output length (long-tailed) [64]")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="TTFT SLO [2000]")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="TPOT SLO [100]")
    p.add_argument("--sim-step-base-seconds", type=float, default=0.01,
                   help="sim: fixed cost of a step [0.01]")
    p.add_argument("--sim-decode-seconds-per-sequence", type=float, default=0.004,
                   help="sim: cost of each decode row [0.004]")
    p.add_argument("--sim-prefill-tokens-per-second", type=float, default=20000.0,
                   help="sim: prefill rate [20000]")
    p.add_argument(
        "--tenants", default=None,
        help="mixed workload: API-key tenants NAME:PRIORITY:SHARE,... (negative priority "
             "is sheddable) "
        f"or a preset ({', '.join(f'{k} = {v}' for k, v in mix.PRESETS.items())}); rows per tenant "
        "[default: one tenant, no API keys]")
    p.add_argument("--kv-transport", choices=("nixl", "grpc"), default="grpc")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", type=Path, default=None)
    p.set_defaults(func=run)


def _worker_args(args: argparse.Namespace, model: str, role: str) -> list[str]:
    engine = ["--engine", args.engine]
    if args.engine == "sim":
        engine += [
            a for flag in SIM_COST for a in (flag, str(getattr(args, flag[2:].replace("-", "_"))))
        ]
    return ["worker", "--role", role, "--model", model, "--served-model-name", "bench",
            "--port", str(free_port()), "--kv-port", str(free_port()),
            "--metrics-port", str(free_port()), "--kv-transport", args.kv_transport, *engine]


def start_stack(args: argparse.Namespace, model: str, admission: bool,
                services: list[ServiceProcess], keys_file: Path | None = None) -> str:
    """A prefill and a decode worker (one torch thread each), the router and the gateway (serving
    the tenants of `keys_file`, or everyone without a key); returns the API URL. Each service goes
    to the front of `services`, the order to stop them in."""
    workers = []
    for role in ("prefill", "decode"):
        workers.append(launch_service(f"{role}-worker", _worker_args(args, model, role),
                                      env={"BATON_NUM_THREADS": "1"}))
        services.insert(0, workers[-1])
    for w in workers:
        w.wait_ready()
    off = [] if admission else ["--queue-max-size", UNBOUNDED, "--queue-max-age-s", UNBOUNDED]
    addresses = ",".join(w.address for w in workers)
    router = launch_service("router", ["router", "--port", str(free_port()),
                                       "--metrics-port", str(free_port()), "--model", "bench",
                                       "--workers", addresses, *off])
    services.insert(0, router)
    router.wait_ready()
    port = free_port()
    slos = (f"{mix.slo_priority(args.tenants)}={args.slo_ttft_ms:g}/{args.slo_tpot_ms:g}"
            if admission else "")
    auth = ["--api-keys-file", str(keys_file)] if keys_file else ["--no-auth"]
    gateway = launch_service("gateway", [
        "gateway", "--host", "127.0.0.1", "--port",
        str(port), "--router", router.address, "--model", model, "--served-model-name", "bench",
        *auth
    ], env={"BATON_SLOS": slos})
    services.insert(0, gateway)
    gateway.wait_ready()
    return f"http://127.0.0.1:{port}/v1"


def figures(point: dict, slo: SLO) -> dict:
    """The run's row: what the summary says, plus refusal latency and late admissions counted per
    request."""
    s, requests = point["summary"], point["requests"]
    ok = [r for r in requests if r["status"] == "ok" and r["ttft_s"] is not None]
    tpots = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok
             if r["output_tokens"] >= 2]
    refusals = [r["refusal_s"] * 1e3 for r in requests if r["refusal_s"] is not None]
    ttfts = [r["ttft_s"] * 1e3 for r in ok]
    p_ttft, p_tpot, p_ref = percentiles(ttfts), percentiles([t * 1e3
                                                             for t in tpots]), percentiles(refusals)
    return dict(sent=s["requests"], answered=s["completed"], refused=s["refused"],
                failed=s["failed"], goodput_rps=s["goodput_rps"], attainment=s["slo_attainment"],
                ttft_p99_ms=p_ttft["p99"], tpot_p99_ms=p_tpot["p99"], late_ttft=sum(t > slo.ttft_ms
                                                                                    for t in ttfts),
                late_tpot=sum(t * 1e3 > slo.tpot_ms for t in tpots), refusal_p50_ms=p_ref["p50"],
                refusal_p99_ms=p_ref["p99"], refusal_max_ms=max(refusals) if refusals else None)


def _workload(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec("synthetic", args.vocab_size, input_len=args.input_len,
                        output_len=args.output_len, max_len=args.max_len, seed=args.seed,
                        avoid=args.avoid)


def _tenant_rows(args: argparse.Namespace, url: str, rate: float, slo: SLO) -> list[dict]:
    runs = asyncio.run(
        mix.run_tenants(url, "bench", args.tenants, _workload(args), rate, args.duration,
                        args.drain_timeout))
    points = mix.tenant_points(runs, slo)
    priority = {t.name: t.priority for t in args.tenants}
    return [
        dict(tenant=name, priority=priority[name], **figures(point, slo),
             served_tokens=point["served_tokens"]) for name, point in points.items()
    ]


def run_case(args: argparse.Namespace, model: str, load: float, admission: bool) -> list[dict]:
    """One fresh stack at one load: a row, or with --tenants a row per tenant."""
    services: list[ServiceProcess] = []
    load_avg = os.getloadavg()[0]  # other sessions share the machine: each row says how busy it was
    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms)
    with tempfile.TemporaryDirectory(prefix="baton-bench-overload-") as tmp:
        try:
            keys = mix.write_keys_file(args.tenants,
                                       Path(tmp) / "keys.yaml") if args.tenants else None
            url = start_stack(args, model, admission, services, keys)
            if args.tenants:
                rows = _tenant_rows(args, url, load * args.rate, slo)
            else:
                test = LoadTest(Target(url,
                                       "bench"), _workload(args), args.duration, args.drain_timeout,
                                rate=load * args.rate, slo=slo, show_progress=False)
                rows = [figures(asyncio.run(test.single()), slo)]
        finally:
            for service in services:
                service.terminate()
    head = dict(load=f"{load:g}x", rate=load * args.rate, admission="on" if admission else "off")
    return [head | row | dict(load_avg=load_avg) for row in rows]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) and abs(value) < 10 else (
        f"{value:,.0f}" if isinstance(value, float) else str(value))


def verdict(rows: list[dict], slo: SLO) -> list[str]:
    """The issue's done-when, read off the rows that were run."""
    on = {r["load"]: r for r in rows if r["admission"] == "on"}
    lines = []
    if "1x" in on and "3x" in on and on["1x"]["goodput_rps"]:
        lines.append(
            "goodput 3x/1x with admission on: "
            f"{on['3x']['goodput_rps'] / on['1x']['goodput_rps']:.0%} "
            "(target >= 90%)")
    for r in rows:
        if r["admission"] == "on":
            lines.append(
                f"{r['load']} on: admitted TTFT p99 {_cell(r['ttft_p99_ms'])} ms (SLO "
                f"{slo.ttft_ms:g}), "
                f"TPOT p99 {_cell(r['tpot_p99_ms'])} ms (SLO {slo.tpot_ms:g}); refusal p99 "
                f"{_cell(r['refusal_p99_ms'])} ms (target < 50)")
    return lines


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from baton.services.common.model_config import context_length, load_config
    from baton.services.checkpoints.tiny_model import embedded_model_path

    logging.getLogger("httpx").setLevel(logging.WARNING)
    model = str(Path(args.model) if args.model else embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    args.vocab_size, args.avoid = len(tokenizer), tuple(tokenizer.all_special_ids)
    args.max_len = context_length(load_config(Path(model)))
    args.tenants = mix.parse_tenants(args.tenants) if args.tenants else None
    cases = [(float(load), admission)
             for admission in ((True,
                                False) if args.admission == "both" else (args.admission == "on", ))
             for load in args.loads.split(",")]
    rows = []
    for load, admission in cases:
        for row in run_case(args, model, load, admission):
            rows.append(row)
            print(json.dumps(row), flush=True)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(_cell(r[c]) for c in columns) + " |")
    lines = mix.tenant_verdict(rows) if args.tenants else verdict(
        rows, SLO(args.slo_ttft_ms, args.slo_tpot_ms))
    for line in lines:
        print(line)
    if args.output_json:
        info = machine_info()
        args.output_json.write_text(
            json.dumps(
                {
                    "command": vars(args) | {"func": None, "output_json": None}, "machine": info,
                    "rows": rows
                }, indent=2, default=str))
    return 0

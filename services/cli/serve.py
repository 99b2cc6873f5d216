"""`baton serve`: the whole stack on one machine, as local processes on loopback: workers (a prefill
and a decode pool, or mixed workers), the router and the gateway. It waits until all are ready,
prints the URL and a sample request, and stops everything (gateway first, workers last, each
draining) on Ctrl-C or SIGTERM. A service that dies meanwhile is restarted on its ports, with a
back-off, while the others keep serving; one that keeps dying (more than --max-restarts times within
--restart-window-s) stops the stack with an error.

On a GPU every worker runs on the same (first visible) device, so each gets a share of its memory:
the workers together may use --gpu-memory-utilization of it, the prefill pool --prefill-memory-share
of that, split evenly within each pool; a worker sizes its KV cache from its share (less its
weights). On the CPU the shares are passed and ignored."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Sequence

from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.services.common.supervisor import GaveUp, RestartPolicy, Supervisor

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the whole stack (workers, router, gateway) on this machine",
        description=__doc__)
    parser.add_argument("--model", default=None,
                        help="checkpoint folder [default: the embedded tiny model]")
    parser.add_argument("--served-model-name", default=None,
                        help="name clients use [default: the folder's]")
    parser.add_argument("--host", default="127.0.0.1", help="gateway address [default: 127.0.0.1]")
    parser.add_argument("--port", type=int, default=8000, help="gateway port [default: 8000]")
    parser.add_argument("--mode", choices=("disaggregated", "colocated"), default="disaggregated")
    parser.add_argument("--prefill-workers", type=int, default=1,
                        help="disaggregated: prefill workers [1]")
    parser.add_argument("--decode-workers", type=int, default=1,
                        help="decode workers (colocated: mixed workers) [default: 1]")
    parser.add_argument(
        "--kv-transport", choices=("nixl", "grpc", "cuda_ipc"), default="nixl",
        help="how decode workers read prefill KV; cuda_ipc: GPU caches on this node, without UCX "
             "[default: nixl]")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9,
        help="share of the GPU's memory all workers together may use [default: 0.9]")
    parser.add_argument(
        "--prefill-memory-share", type=float, default=None,
        help="disaggregated: the prefill workers' part of that share, 0..1 [default: their share "
             "of the worker count]")
    parser.add_argument("--api-keys-file", default=None,
                        help="require API keys from this file [default: no auth]")
    parser.add_argument(
        "--worker-arg", action="append", default=[], metavar="ARG",
        help="extra argument for every worker, e.g. --worker-arg=--num-kv-blocks=512 (repeatable)")
    parser.add_argument(
        "--router-arg", action="append", default=[], metavar="ARG",
        help="extra argument for the router, e.g. --router-arg=--queue-max-size=0 (repeatable)")
    parser.add_argument(
        "--gateway-arg", action="append", default=[], metavar="ARG",
        help="extra argument for the gateway, e.g. --gateway-arg=--slos=0=500/50 (repeatable)")
    parser.add_argument(
        "--max-restarts", type=int, default=5,
        help="deaths of one service within --restart-window-s that are still restarted; one more "
             "stops the stack [default: 5]")
    parser.add_argument("--restart-window-s", type=float, default=120.0,
                        help="the window --max-restarts counts in [default: 120]")
    parser.add_argument(
        "--restart-backoff-s", type=float, default=1.0,
        help="delay before restarting a service that died; doubles while it keeps dying, up to "
             "30 s [default: 1]")
    parser.set_defaults(func=run)


def _roles(args: argparse.Namespace) -> list[str]:
    if args.mode == "colocated":
        return ["mixed"] * args.decode_workers
    return ["prefill"] * args.prefill_workers + ["decode"] * args.decode_workers


def memory_shares(roles: Sequence[str], total: float,
                  prefill_share: float | None = None) -> list[float]:
    """Each worker's --gpu-memory-utilization: `total` split between the pools, then evenly within
    each."""
    if not 0 < total <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], not {total}")
    prefill = sum(role == "prefill" for role in roles)
    others = len(roles) - prefill
    if prefill_share is None or not prefill or not others:
        return [total / len(roles)] * len(roles)
    if not 0 < prefill_share < 1:
        raise ValueError(
            f"--prefill-memory-share must be strictly between 0 and 1, not {prefill_share}")
    return [total * (prefill_share / prefill if role == "prefill" else (1 - prefill_share) / others)
            for role in roles]


def _start_workers(args: argparse.Namespace, model: str, name: str,
                   started: list[ServiceProcess]) -> list[ServiceProcess]:
    roles = _roles(args)
    shares = memory_shares(roles, args.gpu_memory_utilization, args.prefill_memory_share)
    # One core each where there are enough; torch's default (all cores per process) would
    # oversubscribe.
    threads = str(max(1, (os.cpu_count() or 1) // len(roles)))
    workers = []
    for i, (role, share) in enumerate(zip(roles, shares)):
        workers.append(
            launch_service(f"{role}-worker-{i}", [
                "worker", "--role", role, "--model", model, "--served-model-name", name, "--port",
                str(free_port()), "--kv-port",
                str(free_port()), "--metrics-port",
                str(free_port()), "--kv-transport", args.kv_transport,
                f"--gpu-memory-utilization={share:.4f}", *args.worker_arg
            ], env={"BATON_NUM_THREADS": os.environ.get("BATON_NUM_THREADS", threads)}))
        started.insert(0, workers[-1])
    return [w.wait_ready() for w in workers]


def start_stack(args: argparse.Namespace, model: str, name: str,
                started: list[ServiceProcess]) -> None:
    """Starts every service in dependency order, each put at the front of `started` (the order to
    stop them), so a failure part-way still stops what did start."""
    workers = _start_workers(args, model, name, started)
    router = launch_service("router", [
        "router", "--port", str(free_port()), "--metrics-port", str(free_port()), "--model", name,
        "--workers", ",".join(w.address for w in workers), *args.router_arg])
    started.insert(0, router)
    router.wait_ready()
    auth = ["--api-keys-file", args.api_keys_file] if args.api_keys_file else ["--no-auth"]
    gateway = launch_service("gateway", [
        "gateway", "--host", args.host, "--port",
        str(args.port), "--router", router.address, "--model", model, "--served-model-name", name,
        *auth, *args.gateway_arg
    ])
    started.insert(0, gateway)
    gateway.wait_ready()


def run(args: argparse.Namespace) -> int:
    from baton.services.checkpoints.tiny_model import embedded_model_path

    model = str(Path(args.model) if args.model else embedded_model_path())
    name = args.served_model_name or Path(model).name
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    services: list[ServiceProcess] = []
    try:
        try:
            policy = RestartPolicy(args.max_restarts, args.restart_window_s,
                                   args.restart_backoff_s)
            start_stack(args, model, name, services)
        except ValueError as e:
            log.error("baton serve: %s", e)
            return 2
        except RuntimeError as e:
            log.error("the stack did not start: %s", e)
            return 1
        url = f"http://{args.host}:{args.port}/v1"
        print(
            f"baton serve ready: address={args.host}:{args.port} mode={args.mode} "
            f"workers={len(services) - 2} "
            f"model={name}\n"
            f"  OpenAI API: {url}\n  try: curl {url}/completions -H 'Content-Type: "
            "application/json' "
            f"-d '{{\"model\": \"{name}\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16}}'",
            flush=True)
        supervisor = Supervisor(services, policy)
        while not stop.wait(0.2):
            try:
                supervisor.check()
            except GaveUp as e:
                log.error("baton serve: %s; stopping the stack", e)
                return 1
        return 0
    finally:
        for service in services:
            service.terminate()

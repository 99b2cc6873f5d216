"""`baton serve [MODEL] [flags]`: the whole stack on one machine, as local processes on loopback:
workers (a prefill and a decode pool, or mixed workers), the router and the gateway; with
--model repeated, each model's own pools behind the one router and gateway. It takes the
engine's and the gateway's settings under vLLM's flag names (or BATON_* variables, or a --config
file) and passes each to the processes that read it. It checks the model folder, the gateway's port
and every process's flags before starting any, waits until all are ready, prints the URL and a
sample request, and stops everything (gateway first, workers last, each draining) on Ctrl-C or
SIGTERM. A service that dies meanwhile is restarted on its ports, with a back-off, while the others
keep serving; one that keeps dying (more than --max-restarts times within --restart-window-s) stops
the stack with an error.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from baton.services.cli.serve_config import ServeSettings, add_arguments, resolve
from baton.services.cli.serve_models import ModelPlan, model_plans
from baton.services.cli.serve_preflight import (check_command, check_keys_file, check_model,
                                                check_port, check_tensor_parallel,
                                                pool_layout_args, worker_tp_size)
from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.services.common.settings import settings_to_flags
from baton.services.common.supervisor import GaveUp, RestartPolicy, Supervisor
from baton.services.engine.config import EngineConfig
from baton.services.gateway.config import GatewayConfig

log = logging.getLogger(__name__)
# Engine settings serve gives each worker itself rather than passing them on as given.
PER_WORKER = ("model", "served_model_name", "gpu_memory_utilization", "num_threads")
# Gateway settings serve gives the gateway itself.
GATEWAY_OWN = ("router", "metrics_port", "model", "served_model_name", "auth",
               "additional_models")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the whole stack (workers, router, gateway) on this machine",
        description=__doc__, usage="baton serve [MODEL] [flags]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def roles(settings: ServeSettings) -> list[str]:
    serve = settings.serve
    if serve.mode == "colocated":
        return ["mixed"] * serve.decode_workers
    return ["prefill"] * serve.prefill_workers + ["decode"] * serve.decode_workers


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


@dataclass
class Planned:
    """A service to start: its name and `baton` arguments (a worker's: its tensor-parallel
    size)."""
    name: str
    args: list[str]
    tensor_parallel_size: int = 1


def plan_workers(settings: ServeSettings, model: str, name: str, models: int = 1,
                 first: int = 0) -> list[Planned]:
    """Each worker's command line for one of `models` base models, on free loopback ports: the
    engine settings as given, its share of the GPU (each model an equal part), then --worker-arg
    and the role's own extra arguments (the last word wins, the tensor-parallel size included: a
    pool's ranks may differ from the other pool's); numbered from `first`."""
    engine, extra = settings.engine, settings.extra
    worker_roles = roles(settings)
    shares = memory_shares(worker_roles, engine.gpu_memory_utilization / models,
                           settings.serve.prefill_memory_share)
    given = settings_to_flags(engine, [n for n in EngineConfig.model_fields if n not in PER_WORKER])
    own = {role: [*extra["worker_arg"], *(extra["prefill_worker_arg"] if role == "prefill"
                                          else extra["decode_worker_arg"])]
           for role in set(worker_roles)}
    sizes = {role: worker_tp_size([*given, *args], engine.tensor_parallel_size)
             for role, args in own.items()}
    given += pool_layout_args(given, own, sizes)
    # One core per process (each tensor-parallel rank is one) where there are enough; torch's
    # default (all cores per process) would oversubscribe.
    threads = engine.num_threads or max(
        1, (os.cpu_count() or 1) // (models * sum(sizes[role] for role in worker_roles)))
    planned = []
    for i, (role, share) in enumerate(zip(worker_roles, shares), start=first):
        planned.append(Planned(f"{role}-worker-{i}", [
            "worker", "--role", role, "--host", "127.0.0.1", "--port", str(free_port()),
            "--kv-port", str(free_port()), "--metrics-port", str(free_port()),
            f"--kv-transport={settings.serve.kv_transport}", f"--model={model}",
            f"--served-model-name={name}", f"--gpu-memory-utilization={share:.4f}",
            f"--num-threads={threads}", *given, *own[role]], sizes[role]))
    return planned


def plan_stack(settings: ServeSettings, models: Sequence[ModelPlan]) -> list[Planned]:
    """Every model's workers, each model's pools shaped alike by the role flags."""
    planned: list[Planned] = []
    for plan in models:
        planned += plan_workers(settings, plan.path, plan.name, len(models), len(planned))
    return planned


def router_args(settings: ServeSettings, models: Sequence[ModelPlan],
                workers: Sequence[str]) -> list[str]:
    # The router hashes prompts into blocks as the workers do, so it takes their block size.
    more = [m.name for m in models[1:]]
    return ["router", "--host", "127.0.0.1", "--port", str(free_port()), "--metrics-port",
            str(free_port()), f"--model={models[0].name}", *(["--additional-models", *more]
                                                            if more else []),
            f"--block-size={settings.engine.block_size}", "--workers", ",".join(workers),
            *settings.extra["router_arg"]]


def gateway_args(settings: ServeSettings, models: Sequence[ModelPlan], router: str) -> list[str]:
    gateway = settings.gateway
    given = settings_to_flags(gateway,
                              [n for n in GatewayConfig.model_fields if n not in GATEWAY_OWN])
    more = [f"{m.name}={m.path}" for m in models[1:]]
    return ["gateway", "--router", router, f"--model={models[0].path}",
            f"--served-model-name={models[0].name}",
            *(["--additional-models", *more] if more else []),
            "--auth" if settings.auth else "--no-auth", *given, *settings.extra["gateway_arg"]]


def check_commands(settings: ServeSettings, workers: list[Planned],
                   models: Sequence[ModelPlan]) -> None:
    """Each process's command line as that process will parse and validate it; ValueError on one
    line."""
    for args in {tuple(w.args[1:]) for w in workers}:
        check_command("worker", list(args))
    check_command("router", router_args(settings, models, ["127.0.0.1:1"])[1:])
    check_command("gateway", gateway_args(settings, models, "127.0.0.1:1")[1:])


WORKER_READY_S = 120.0


def start_stack(settings: ServeSettings, models: Sequence[ModelPlan],
                started: list[ServiceProcess],
                workers: list[Planned] | None = None) -> ServiceProcess:
    """Starts every service in dependency order, each put at the front of `started` (the order to
    stop them), so a failure part-way still stops what did start; returns the gateway."""
    launched = []
    planned_workers = workers or plan_stack(settings, models)
    for planned in planned_workers:
        launched.append(launch_service(planned.name, planned.args))
        started.insert(0, launched[-1])
    # Every worker's ranks start at once on the same cores: each rank is one more process there.
    ready_s = WORKER_READY_S * sum(w.tensor_parallel_size for w in planned_workers)
    addresses = [w.wait_ready(ready_s).address for w in launched]
    router = launch_service("router", router_args(settings, models, addresses))
    started.insert(0, router)
    router.wait_ready()
    gateway = launch_service("gateway", gateway_args(settings, models, router.address))
    started.insert(0, gateway)
    return gateway.wait_ready()


def _models(settings: ServeSettings) -> list[ModelPlan]:
    engine = settings.engine
    if engine.model is None:
        from baton.services.checkpoints.tiny_model import embedded_model_path  # torch: only here

        model = str(embedded_model_path())
    else:
        model = str(Path(engine.model))
    first = ModelPlan(model, engine.served_model_name or Path(model).name)
    return model_plans(first, settings.more_models, settings.more_names)


def _ready_line(settings: ServeSettings, gateway: ServiceProcess, workers: int,
                models: Sequence[ModelPlan]) -> str:
    url = f"http://{gateway.address}/v1"
    name = models[0].name
    return (f"baton serve ready: address={gateway.address} mode={settings.serve.mode} "
            f"workers={workers} model={','.join(m.name for m in models)}\n  OpenAI API: {url}\n"
            f"  try: curl {url}/completions "
            f"-H 'Content-Type: application/json' -d '{{\"model\": \"{name}\", \"prompt\": "
            f"\"Once upon a time\", \"max_tokens\": 16}}'")


def _prepare(args: argparse.Namespace) -> tuple[ServeSettings, list[ModelPlan], list[Planned]]:
    """The settings, the models and the workers' plan, every check passed; ValueError
    otherwise."""
    settings = resolve(args)
    for model in (settings.engine.model, *settings.more_models):
        check_model(model)
    check_keys_file(settings.gateway.api_keys_file, settings.auth)
    check_port(settings.gateway.host, settings.gateway.port)
    models = _models(settings)
    workers = plan_stack(settings, models)
    for plan in models:
        check_tensor_parallel(plan.path, {w.args[2]: w.tensor_parallel_size for w in workers},
                              settings.serve.kv_transport)
    check_commands(settings, workers, models)
    return settings, models, workers


def run(args: argparse.Namespace) -> int:
    try:
        settings, models, workers = _prepare(args)
        serve = settings.serve
        policy = RestartPolicy(serve.max_restarts, serve.restart_window_s, serve.restart_backoff_s)
    except ValueError as e:
        log.error("baton serve: %s", e)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    services: list[ServiceProcess] = []
    try:
        try:
            gateway = start_stack(settings, models, services, workers)
        except RuntimeError as e:
            log.error("the stack did not start: %s", e)
            return 1
        print(_ready_line(settings, gateway, len(workers), models), flush=True)
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

"""The one way tests start Baton services: real processes on loopback, each on free ports.

- `start_stack`: the whole stack (workers, router, gateway), started as `baton serve` starts it.
- `start_workers`: engine workers alone, one per role, for the worker tests; `launch_worker`: one
  more, not yet ready (one that joins a running stack, say).
- `launch_sim_worker` / `launch_router` / `launch_gateway`: single services started side by side,
  not yet ready (the caller waits), for the router service, tracing and migration tests;
  `sim_backend` and `gateway_on`: a sim worker and a router, ready, and gateways over them, for
  tests of the gateway's HTTP side (tests/gateway/conftest.py shares one backend per session).
Plus what every caller needs around them: metric scrapes, stopping, waiting for a condition."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from baton.services.cli import serve
from baton.services.cli.main import build_parser
from baton.services.cli.serve_config import resolve
from baton.services.cli.serve_models import ModelPlan
from baton.services.common.process import ServiceProcess, free_port, launch_service
from baton.v1 import worker_pb2_grpc

SIM_MODEL = "tiny-llama"  # the embedded model's folder name, which sim workers serve under
SIM_BLOCKS = 256
KV_BLOCKS = 256  # small caches start fast; every test prompt fits many times over
ONE_THREAD = {"BATON_NUM_THREADS": "1"}
STATE_DIR = Path(tempfile.mkdtemp(prefix="baton-test-state-"))


def private_state_store() -> str:
    """A state store (SQLite file) of one gateway's own: the gateways of different tests never
    share, or wait on, one file."""
    return f"sqlite:///{STATE_DIR / uuid.uuid4().hex}.db"


# -- metrics --------------------------------------------------------------------------------------


def scrape(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (those matching `labels`) from a live /metrics scrape."""
    return sample_sum(urllib.request.urlopen(url, timeout=10).read().decode(), name, **labels)


def sample_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (those matching `labels`) in one /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name) or line[len(name)] not in " {":
            continue
        sample_labels, _, value = line[len(name):].rpartition(" ")
        if all(f'{k}="{v}"' in sample_labels for k, v in labels.items()):
            total += float(value)
    return total


def metric(service: ServiceProcess, name: str) -> float:
    """Sum of a metric's samples from the service's /metrics (its port is in its ready line)."""
    port = next(int(m.group(1)) for line in service.output
                if (m := re.search(r"metrics on :(\d+)", line)))
    return scrape(f"http://127.0.0.1:{port}/metrics", name)


# -- the whole stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    services: list[ServiceProcess]  # in the order to stop them: gateway, router, workers
    port: int
    metrics_port: int  # the gateway's, which needs no key (its API port's /metrics may)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def gateway(self) -> ServiceProcess:
        return self.services[0]

    @property
    def router(self) -> ServiceProcess:
        return self.services[1]

    def workers(self, role: str | None = None) -> list[ServiceProcess]:
        return [s for s in self.services[2:] if role is None or s.name.startswith(role)]

    def busiest_live_decode(self) -> ServiceProcess:
        """The running decode worker with the most requests in flight (the one to kill in a
        migration test)."""
        live = [w for w in self.workers("decode") if w.process.poll() is None]
        return max(live, key=lambda w: metric(w, "baton_num_requests_running"))

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def gateway_metric(self, name: str, **labels: str) -> float:
        return scrape(self.metrics_url, name, **labels)

    def stop(self) -> None:
        for service in self.services:
            service.terminate()


def blocks_all_free(stack: Stack) -> bool:
    return all(metric(w, "baton_kv_cache_free_blocks") == metric(w, "baton_kv_cache_total_blocks")
               for w in stack.workers())


def start_stack(model: Path, mode: str = "disaggregated", decode_workers: int = 1,
                api_keys_file: Path | None = None, kv_transport: str = "nixl",
                worker_arg: tuple[str, ...] = ("--num-kv-blocks=512",),
                router_args: list[str] | None = None,
                gateway_args: list[str] | None = None) -> Stack:
    """The stack `baton serve` starts from these arguments, its gateway on a free port."""
    metrics_port = free_port()
    argv = ["serve", str(model), "--mode", mode, "--decode-workers", str(decode_workers),
            "--kv-transport", kv_transport, "--port", str(free_port()),
            *(f"--worker-arg={a}" for a in worker_arg),
            *(f"--router-arg={a}" for a in router_args or []),
            f"--gateway-arg=--metrics-port={metrics_port}",
            *(f"--gateway-arg={a}" for a in gateway_args or []),
            *([] if any(a.startswith("--state-store") for a in gateway_args or [])
              else [f"--gateway-arg=--state-store={private_state_store()}"]),
            *(["--api-keys-file", str(api_keys_file)] if api_keys_file else [])]
    settings = resolve(build_parser("serve").parse_args(argv))
    services: list[ServiceProcess] = []
    try:
        serve.start_stack(settings, [ModelPlan(str(model), model.name)], services)
    except BaseException:
        for service in services:
            service.terminate()
        raise
    return Stack(services, settings.gateway.port, metrics_port)


class ServeCommand:
    """`baton serve ARGS` as a user starts it, its output kept; its gateway on a free port, given
    as --port or (port_variable) as BATON_PORT."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 port_variable: bool = False) -> None:
        self.port = free_port()
        port_flag = [] if port_variable else ["--port", str(self.port)]
        port_env = {"BATON_PORT": str(self.port)} if port_variable else {}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "baton.services.cli.main", "serve", *port_flag, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **ONE_THREAD, "BATON_STATE_STORE": private_state_store(),
                 **port_env, **(env or {})})
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("baton serve ready"):
                self.ready.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def children(self) -> list[list[str]]:
        """The command lines of the services it runs now."""
        return [child.cmdline() for child in psutil.Process(self.process.pid).children()]

    def decode_workers(self) -> dict[int, int]:
        """pid -> metrics port of each decode worker running now."""
        workers = {}
        for child in psutil.Process(self.process.pid).children():
            command = child.cmdline()
            if "decode" in command:
                workers[child.pid] = int(command[command.index("--metrics-port") + 1])
        return workers

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# -- engine workers -------------------------------------------------------------------------------


@dataclass
class Worker:
    service: ServiceProcess
    metrics_port: int

    @property
    def address(self) -> str:
        return self.service.address

    def stub(self) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(grpc.aio.insecure_channel(self.address))

    def metric(self, name: str, **labels: str) -> float:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", name, **labels)


def start_workers(model: Path, roles: Sequence[str], transport: str = "nixl",
                  *extra: str) -> list[Worker]:
    """Starts one worker per role side by side and returns them once all are serving."""
    workers = []
    for role in roles:
        metrics_port = free_port()
        args = ["worker", "--role", role, "--model", str(model), "--port", str(free_port()),
                "--kv-port", str(free_port()), "--metrics-port", str(metrics_port),
                "--kv-transport", transport, "--num-kv-blocks", str(KV_BLOCKS), *extra]
        workers.append(Worker(launch_service(f"{role}-worker", args, env=ONE_THREAD), metrics_port))
    try:
        for worker in workers:
            worker.service.wait_ready()
    except BaseException:  # the others would outlive the test run
        stop_all([w.service for w in workers])
        raise
    return workers


def launch_worker(name: str, model: Path, *extra: str, role: str = "mixed") -> Worker:
    """One engine worker, not yet ready, started apart from any stack (one that joins a running
    stack's router with --router, say); its own transport is gRPC."""
    metrics_port = free_port()
    args = ["worker", "--role", role, "--host", "127.0.0.1", "--model", str(model), "--port",
            str(free_port()), "--kv-port", str(free_port()), "--metrics-port", str(metrics_port),
            "--kv-transport", "grpc", *extra]
    return Worker(launch_service(name, args, env=ONE_THREAD), metrics_port)


# -- routers and simulated workers ----------------------------------------------------------------


def launch_sim_worker(name: str, *extra: str, role: str = "mixed",
                      env: dict[str, str] | None = None) -> tuple[ServiceProcess, str]:
    """The process and the address it will serve on (known before it is ready, so routers can
    start beside it)."""
    port = free_port()
    args = ["worker", "--engine", "sim", "--role", role, "--port", str(port),
            "--kv-transport", "grpc", "--num-kv-blocks", str(SIM_BLOCKS), *extra]
    return launch_service(name, args, env={**ONE_THREAD, **(env or {})}), f"127.0.0.1:{port}"


def launch_router(name: str, *extra: str,
                  env: dict[str, str] | None = None) -> tuple[ServiceProcess, int]:
    """The process and its metrics port; the router serves SIM_MODEL and polls quickly."""
    metrics_port = free_port()
    args = ["router", "--port", str(free_port()), "--model", SIM_MODEL,
            "--metrics-port", str(metrics_port), "--stats-poll-interval-s", "0.1",
            "--tick-interval-s", "0.1", *extra]
    return launch_service(name, args, env=env), metrics_port


def launch_gateway(name: str, router_address: str, *extra: str,
                   env: dict[str, str] | None = None) -> tuple[ServiceProcess, int]:
    """The process and its HTTP port; no API keys unless `extra` names a keys file."""
    port = free_port()
    auth = [] if any(a.startswith("--api-keys-file") for a in extra) else ["--no-auth"]
    own = any(a.startswith("--state-store") for a in extra) or "BATON_STATE_STORE" in (env or {})
    store = [] if own else [f"--state-store={private_state_store()}"]
    args = ["gateway", "--host", "127.0.0.1", "--port", str(port), "--router", router_address,
            *auth, *store, *extra]
    return launch_service(name, args, env=env), port


@contextlib.contextmanager
def sim_backend() -> Iterator[str]:
    """A sim worker (50 ms per step) and a router over it, both ready: the router's address. Both
    stop when the block ends."""
    started: list[ServiceProcess] = []
    try:
        worker, address = launch_sim_worker("worker", "--sim-step-base-seconds", "0.05")
        started.append(worker.wait_ready())
        router, _ = launch_router("router", "--workers", address)
        started.append(router.wait_ready())
        yield router.address
    finally:
        for service in reversed(started):
            service.terminate()


@contextlib.contextmanager
def gateway_on(router_address: str, *gateway_args: str) -> Iterator[int]:
    """A gateway over `router_address` started with `gateway_args`, ready: its HTTP port. It stops
    when the block ends."""
    gateway, port = launch_gateway("gateway", router_address, *gateway_args)
    try:
        gateway.wait_ready()
        yield port
    finally:
        gateway.terminate()


# -- stopping and waiting -------------------------------------------------------------------------


def stop_all(services: list[ServiceProcess], timeout: float = 15.0) -> list[int]:
    """SIGTERM to all at once, then the exit codes: each drains in parallel rather than one after
    another."""
    for service in services:
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
    codes = []
    for service in services:
        # One signal only: a second one landing after the service's loop closed would kill it
        # mid-exit.
        try:
            codes.append(service.process.wait(timeout))
        except subprocess.TimeoutExpired:
            service.kill()
            codes.append(service.process.returncode)
    return codes


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.05)

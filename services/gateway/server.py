"""Builds the gateway from its configuration and serves it with uvicorn until SIGTERM or Ctrl-C;
beside it, the metrics port, the router health check and the API-keys reload (SIGHUP or a change of
the file)."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from baton.services.common.http_probe import serve_probes
from baton.services.common.tracing import setup_tracing
from baton.services.gateway.app import create_app
from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.http_timeouts import Deadlines, timed_protocol
from baton.services.gateway.key_reload import KeyReloader
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.orchestrator import Orchestrator, PrefillDeadline
from baton.services.gateway.rate_limits.limiter import build_limiter
from baton.services.gateway.readiness import RouterHealth
from baton.services.gateway.served_model import (ServedModel, load_served_model,
                                                  parse_model_entry)
from baton.services.gateway.state import Gateway
from baton.services.gateway.tenants import KeyStore
from baton.services.gateway.usage_meter import UsageMeter
from baton.services.gateway.worker_limits import WorkerLimits
from baton.services.state.durations import parse_duration
from baton.services.state.store import StateStore
from baton.services.state.urls import StoreUnavailable

log = logging.getLogger(__name__)


def build_gateway(config: GatewayConfig) -> Gateway:
    if config.model is None:
        from baton.services.checkpoints.tiny_model import embedded_model_path
        config = config.model_copy(update={"model": str(embedded_model_path())})
    keys = None
    if config.auth:
        if config.api_keys_file is None:
            raise ValueError(
                "auth is on but no --api-keys-file was given; pass one, or --no-auth for local use")
        keys = KeyStore.load(config.api_keys_file)
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, config.tenant_metrics_label)
    orchestrator = Orchestrator(
        config.router, config.max_migrations,
        PrefillDeadline(config.prefill_timeout_slo_factor, config.prefill_timeout_s))
    store = StateStore(config.state_store, config.state_store_timeout_s)
    ttl_s = parse_duration(config.response_ttl) if config.response_ttl else None
    meter = UsageMeter(store, metrics.state_store_failures, config.usage_stale_after_s, ttl_s)
    models = served_models(config, str(config.model))
    return Gateway(
        config=config, models=models, orchestrator=orchestrator, keys=keys, metrics=metrics,
        registry=registry, limiter=build_limiter(config, metrics),
        router_health=RouterHealth(orchestrator.channel, config.router_check_interval_s,
                                   metrics.router_up),
        store=store, meter=meter, response_ttl_s=ttl_s)


def served_models(config: GatewayConfig, path: str) -> dict[str, ServedModel]:
    """--model's folder `path` (named --served-model-name, else the folder's name) first, then
    --additional-models; ValueError for a name given twice."""
    name = config.served_model_name or Path(path).name
    models = {name: load_served_model(name, path, config.tool_call_parser, config.max_model_len)}
    for entry in config.additional_models:
        extra, extra_path = parse_model_entry(entry)
        if extra in models:
            raise ValueError(f"--additional-models: the model name {extra!r} is given twice")
        models[extra] = load_served_model(extra, extra_path, config.tool_call_parser,
                                          config.max_model_len, strict_limit=False)
    return models


def listen_socket(host: str, port: int) -> socket.socket:
    """The bound socket uvicorn serves on. Its proto must say TCP: asyncio sets TCP_NODELAY only on
    accepted sockets whose proto is IPPROTO_TCP, and with Nagle on, a response written in two parts
    (headers, then body) waits for the client's delayed ACK: 40 ms added to every refusal and every
    streamed chunk."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def _uvicorn_config(gateway: Gateway) -> uvicorn.Config:
    config = gateway.config
    deadlines = Deadlines(config.http_idle_timeout_s, config.http_header_timeout_s,
                          config.http_body_timeout_s)
    timeouts = gateway.metrics.client_timeouts
    return uvicorn.Config(
        create_app(gateway), log_level="warning", timeout_graceful_shutdown=30,
        http=timed_protocol(deadlines, lambda phase: timeouts.labels(phase).inc()),
        # the same idle deadline for uvicorn's own keep-alive timer, which runs besides
        timeout_keep_alive=config.http_idle_timeout_s)


def _background(gateway: Gateway, limits: WorkerLimits) -> list[asyncio.Task]:
    """The router health check, the workers' limits, the runtime LoRA adapters' re-assertion and,
    with auth on, the API-keys reload (on SIGHUP too)."""
    tasks: list[asyncio.Task] = [asyncio.ensure_future(limits.watch())]
    if gateway.meter is not None:
        tasks.append(asyncio.ensure_future(
            gateway.meter.watch(gateway.config.usage_update_interval_s)))
    if gateway.router_health is not None:
        tasks.append(asyncio.ensure_future(gateway.router_health.watch()))
    if gateway.lora_reconciler is not None:
        tasks.append(asyncio.ensure_future(gateway.lora_reconciler.watch()))
    config, reloader = gateway.config, None
    if gateway.keys is not None and config.api_keys_file is not None:
        reloader = KeyReloader(gateway.keys, Path(config.api_keys_file),
                               config.api_keys_poll_interval_s, gateway.metrics.key_reloads)
        tasks.append(asyncio.ensure_future(reloader.watch()))

    def on_hangup() -> None:
        if reloader is None:
            log.info("SIGHUP: no API-keys file to reload (auth is off)")
        else:
            reloader.check("SIGHUP", force=True)

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hangup)
    return tasks


async def _migrate(gateway: Gateway) -> None:
    """Brings the state store's schema up to date; a store down now is tried again when a request
    needs it (requests with `store: false` are served meanwhile)."""
    if gateway.store is None:
        return
    try:
        await gateway.store.ready()
    except StoreUnavailable as e:
        log.warning("state store %s: %s; retried when a request needs it",
                    gateway.store.describe(), e)


async def serve(config: GatewayConfig) -> int:
    setup_tracing("baton-gateway")
    gateway = build_gateway(config)
    sock = listen_socket(config.host, config.port)
    port = sock.getsockname()[1]
    limits = WorkerLimits(gateway, gateway.orchestrator.channel, config.router_check_interval_s)
    await limits.first()
    await _migrate(gateway)
    tasks = _background(gateway, limits)
    probes = None
    if config.metrics_port is not None:
        probes = serve_probes(config.host, config.metrics_port, gateway.registry,
                              lambda: gateway.not_ready() is None)
    server = uvicorn.Server(_uvicorn_config(gateway))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        metrics_at = f", metrics on :{probes.server_address[1]}" if probes else ""
        # The one line launchers and tests wait for.
        print(
            f"baton gateway ready: address={config.host}:{port} url=http://{config.host}:{port}/v1 "
            f"model={','.join(gateway.models)}{metrics_at}", flush=True)
    try:
        await task
    finally:
        for background in tasks:
            background.cancel()
        if probes is not None:
            probes.shutdown()
        await gateway.limiter.close()
        if gateway.meter is not None:
            await gateway.meter.drain()
    return 0

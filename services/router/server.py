"""Assembles a router process: the facade, its gRPC service with standard health checks, worker
feeds from registrations, a static list or EndpointSlices, the housekeeping and plugin-config loops,
HTTP probes and metrics, and a clean exit on SIGTERM."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from pydantic import Field

from baton.services.common.http_probe import serve_probes
from baton.services.common.settings import BatonSettings
from baton.services.common.tracing import setup_tracing
from baton.services.router.config import ConfigWatcher, RouterConfig
from baton.services.router.discovery import EndpointSliceWatcher, parse_static
from baton.services.router.router import Router
from baton.services.router.servicer import RouterServicer
from baton.services.router.worker_feeds import FeedSet
from baton.v1 import router_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "baton.v1.Router"


class RouterServiceConfig(BatonSettings):
    """The process around the routing policy (RouterConfig): where it listens and how it finds
    workers."""
    host: str = Field("127.0.0.1", description="Address the gRPC service listens on")
    port: int = Field(50061, ge=0, le=65535,
                      description="gRPC port (0: any free port, printed at start)")
    advertise_host: str | None = Field(None,
                                       description="Host printed in the ready line (default: host)")
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="HTTP port for /metrics, /health, /ready, GET /stats and POST /admin/drain "
                    "(unset: no HTTP server)")
    workers: str | None = Field(
        None, description="Static workers, host:port,host:port (besides registrations)")
    kube_label_selector: str | None = Field(
        None,
        description="Find workers from the EndpointSlices with these labels (e.g. app=baton-worker)"
    )
    kube_namespace: str = Field("default", description="Namespace of the worker EndpointSlices")
    kube_port_name: str | None = Field(
        "grpc",
        description="EndpointSlice port that serves the worker's gRPC (unset: the slice's only "
                    "port)"
    )
    stats_poll_interval_s: float = Field(0.5, gt=0,
                                         description="How often each worker's GetStats is polled")
    worker_rpc_timeout_s: float = Field(2.0, gt=0,
                                        description="Deadline of a GetStats or GetKVSnapshot call")
    tick_interval_s: float = Field(
        0.2, gt=0,
        description="Housekeeping period: expired leases, dropped workers, queue deadlines")


def stats_json(router: Router) -> dict[str, Any]:
    """GET /stats: the GetStats numbers as JSON, pools keyed by role name, for the operator's
    autoscaler; `models` has each served model's own pools (`pools` sums them)."""
    stats = router.stats()

    def by_role(pools: dict) -> dict[str, Any]:
        return {role.label: dataclasses.asdict(pool) for role, pool in pools.items()}

    return {"pools": by_role(stats.pools),
            "models": {name: {"pools": by_role(pools)}
                       for name, pools in router.pools_by_model().items()},
            "queued_requests": stats.queued_requests, "leases": stats.leases}


def drain_json(router: Router, body: Any) -> dict[str, Any]:
    """POST /admin/drain {"worker_ids": [...]}: Drain over HTTP, for the operator's scale-down."""
    ids = body.get("worker_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError('expected {"worker_ids": ["<worker id>", ...]}')
    unknown = router.drain(ids)
    log.info("draining %s (asked over HTTP)", [w for w in ids if w not in unknown])
    return {"unknown_worker_ids": unknown}


async def _every(interval_s: float, fn) -> None:
    while True:
        await asyncio.sleep(interval_s)
        fn()


def _config_poller(router: Router, watcher: ConfigWatcher):
    def poll() -> None:
        settings = watcher.poll()
        if settings is not None:
            router.apply_plugin_settings(settings)
            log.info("plugin settings reloaded from %s: %s", watcher.path, settings.model_dump())
        elif watcher.last_error is not None:
            log.error("plugin settings in %s not applied (last good ones stay): %s", watcher.path,
                      watcher.last_error)
            watcher.last_error = None  # logged once per bad version of the file
    return poll


def _discover(service: RouterServiceConfig, feeds: FeedSet,
              loop: asyncio.AbstractEventLoop) -> EndpointSliceWatcher | None:
    """Feeds for the static workers, and the EndpointSlice watcher when one is configured."""
    if service.workers:
        feeds.set_discovered(parse_static(service.workers))
    if not service.kube_label_selector:
        return None
    watcher = EndpointSliceWatcher(
        service.kube_namespace, service.kube_label_selector, service.kube_port_name,
        lambda addresses: loop.call_soon_threadsafe(feeds.set_discovered, addresses))
    watcher.start()
    return watcher


def _background(service: RouterServiceConfig, config: RouterConfig, router: Router,
                feeds: FeedSet) -> list[asyncio.Task]:
    """The housekeeping tick and, with a plugin file, its reload."""

    def tick() -> None:
        router.tick()
        feeds.reconcile(router.members())

    tasks = [asyncio.ensure_future(_every(service.tick_interval_s, tick))]
    if config.plugin_config_file is not None:
        poll = _config_poller(router,
                              ConfigWatcher(config.plugin_config_file, config.plugin_settings()))
        poll()
        tasks.append(asyncio.ensure_future(_every(config.config_poll_interval_s, poll)))
    return tasks


async def serve(service: RouterServiceConfig, config: RouterConfig) -> int:
    setup_tracing("baton-router")
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    # The callback only runs once a request has queued, by when `servicer` (bound late by the
    # closure) exists.
    router = Router(config, registry,
                    on_queued_outcome=lambda outcome: servicer.on_queued_outcome(outcome))
    feeds = FeedSet(router, service.stats_poll_interval_s, service.worker_rpc_timeout_s)
    servicer = RouterServicer(router, feeds, loop)
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{service.host}:{service.port}")
    stopping = asyncio.Event()
    probes = None
    if service.metrics_port is not None:
        probes = serve_probes(service.host, service.metrics_port, registry,
                              lambda: not stopping.is_set(),
                              get_routes={"/stats": lambda: stats_json(router)},
                              post_routes={"/admin/drain": lambda body: drain_json(router, body)})
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    watcher = _discover(service, feeds, loop)
    tasks = _background(service, config, router, feeds)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    metrics_at = f", metrics on :{probes.server_address[1]}" if probes else ""
    # The one line launchers and tests wait for: it says the router is serving and where.
    print(
        f"baton router ready: address={service.advertise_host or service.host}:{port} "
        f"model={config.model}"
        f"{metrics_at}", flush=True)
    await stopping.wait()
    log.info("stopping: %d leases open, %d requests queued",
             router.stats().leases, len(router.admission.queue))
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if watcher is not None:
        watcher.stop()
    for task in tasks:
        task.cancel()
    await server.stop(grace=1)
    await feeds.close()
    if probes:
        probes.shutdown()
    return 0

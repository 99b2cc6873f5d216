"""Assembles a worker: engine on its thread, KV transport, gRPC service with standard health checks,
HTTP probes and metrics, and a SIGTERM drain (stop taking work, finish what is in flight, release
leases, exit 0)."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from baton.services.common.http_probe import serve_probes
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.metrics import EngineCollector
from baton.services.engine.runner import SimRunnerFactory
from baton.services.worker.config import WorkerConfig
from baton.services.worker.decode import DecodeSide
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.kv_events import KVEventLog
from baton.services.worker.kv_transfer import KVTransport, make_transport
from baton.services.worker.metrics import WorkerMetrics
from baton.services.worker.prefill import PrefillSide
from baton.services.worker.registration import keep_registered
from baton.services.worker.servicer import WorkerServicer
from baton.services.worker.vllm_metrics import VllmNames
from baton.v1 import worker_pb2_grpc
from baton.services.common.tracing import setup_tracing

log = logging.getLogger(__name__)
SERVICE_NAME = "baton.v1.Worker"


@dataclass
class _Parts:
    """What one worker process runs, built before it starts serving."""
    engine: LLMEngine
    server: grpc.aio.Server
    address: str
    worker_id: str
    transport: KVTransport
    loop: EngineLoop
    metrics: WorkerMetrics
    prefill: PrefillSide
    servicer: WorkerServicer
    health: health.aio.HealthServicer
    probes: ThreadingHTTPServer | None


def _build(config: WorkerConfig, engine_config: EngineConfig,
           sim_runner: SimRunnerFactory | None) -> _Parts:
    engine = LLMEngine(engine_config, sim_runner=sim_runner)
    engine.record_block_events()
    server = grpc.aio.server()
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    host = config.advertise_host or config.host
    address = f"{host}:{port}"
    worker_id = config.worker_id or address
    registry = CollectorRegistry()
    engine_metrics = EngineCollector(engine)
    registry.register(engine_metrics)
    metrics = WorkerMetrics(registry, engine.model_id)
    registry.register(
        VllmNames([engine_metrics, metrics.ttft, metrics.itl, metrics.e2e, metrics.finished]))
    kv_port = port if config.kv_transport == "grpc" else config.kv_port or port + 1
    transport = make_transport(config.kv_transport, engine.kv_cache, name=f"baton-{worker_id}",
                               host=host, port=kv_port, registry=registry,
                               ucx_tls=config.kv_ucx_tls, heads=engine.attention_heads,
                               executor=engine.rank_executor, head_cache=engine.head_kv_cache)
    if engine.head_kv_cache is not None:
        log.info("KV hand-offs carry the EAGLE head's KV too%s", " (not over cuda_ipc)"
                 if config.kv_transport == "cuda_ipc" else "")
    loop = EngineLoop(engine, asyncio.get_running_loop())
    events = KVEventLog(config.kv_event_buffer)
    loop.after_step.append(events.drain)
    prefill = PrefillSide(config, loop, transport, metrics, worker_id, address)
    decode = DecodeSide(config, loop, transport, metrics)
    servicer = WorkerServicer(config, engine, loop, prefill, decode, events, worker_id)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    probes = None
    if config.metrics_port is not None:
        probes = serve_probes(config.host, config.metrics_port, registry,
                              lambda: not servicer.draining)
    return _Parts(engine, server, address, worker_id, transport, loop, metrics, prefill,
                  servicer, health_servicer, probes)


async def serve(config: WorkerConfig, engine_config: EngineConfig,
                sim_runner: SimRunnerFactory | None = None) -> int:
    """sim_runner: builds the engine's runner under engine=sim (see LLMEngine); the command
    supplies it."""
    setup_tracing(f"baton-worker-{config.role}")
    parts = _build(config, engine_config, sim_runner)
    # Everything built so far (model, tokenizer, caches, gRPC) lives as long as the process; frozen,
    # the collector's full passes no longer walk it and bill the pause to a decode step.
    gc.freeze()
    parts.loop.start()
    await parts.server.start()
    for name in ("", SERVICE_NAME):
        await parts.health.set(name, health_pb2.HealthCheckResponse.SERVING)
    housekeeping = asyncio.ensure_future(parts.prefill.housekeeping())
    registration = None
    if config.router:
        registration = asyncio.ensure_future(keep_registered(
            config.router, parts.worker_id, parts.address, config.role, parts.engine.model_id,
            parts.engine.block_size))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    metrics_at = f", metrics on :{parts.probes.server_address[1]}" if parts.probes else ""
    # The one line launchers and tests wait for: it says the worker is serving and where.
    print(
        f"baton worker ready: role={config.role} address={parts.address} "
        f"transport={parts.transport.name}{metrics_at}",
        flush=True)
    await stop.wait()
    if registration is not None:
        # stop heartbeating first: the router stops placing here as the lease runs out
        registration.cancel()
    await _drain(config, parts.servicer, parts.health, parts.metrics, parts.prefill)
    housekeeping.cancel()
    await parts.server.stop(grace=1)
    parts.loop.stop()
    parts.transport.close()
    if parts.probes:
        parts.probes.shutdown()
    return 0


async def _drain(config: WorkerConfig, servicer: WorkerServicer,
                 health_servicer: health.aio.HealthServicer, metrics: WorkerMetrics,
                 prefill: PrefillSide) -> None:
    servicer.draining = True
    metrics.draining.labels(metrics.model_name).set(1)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    log.info("draining: %d requests in flight, %d leases held", servicer.in_flight,
             len(prefill.leases))
    try:
        await asyncio.wait_for(servicer.idle.wait(), timeout=config.drain_grace_seconds)
    except asyncio.TimeoutError:
        log.warning("drain grace of %ss ran out with %d requests in flight",
                    config.drain_grace_seconds, servicer.in_flight)
    await prefill.release_all()

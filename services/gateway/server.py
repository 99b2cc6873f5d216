"""Builds the gateway from its configuration and serves it with uvicorn until SIGTERM or Ctrl-C."""
from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer

from baton.services.common.model_config import context_length, load_config
from baton.services.common.tool_parsers import parser_for_model
from baton.services.common.tracing import setup_tracing
from baton.services.gateway.app import Gateway, create_app
from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.orchestrator import Orchestrator, PrefillDeadline
from baton.services.gateway.rate_limits import RateLimiter
from baton.services.gateway.tenants import KeyStore

log = logging.getLogger(__name__)


def build_gateway(config: GatewayConfig) -> Gateway:
    if config.model is None:
        from baton.services.checkpoints.tiny_model import embedded_model_path
        config = config.model_copy(update={"model": str(embedded_model_path())})
    model_dir = Path(config.model)
    keys = None
    if config.auth:
        if config.api_keys_file is None:
            raise ValueError(
                "auth is on but no --api-keys-file was given; pass one, or --no-auth for local use")
        keys = KeyStore.load(config.api_keys_file)
    registry = CollectorRegistry()
    model_config = load_config(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return Gateway(
        config=config, tokenizer=tokenizer, model_name=config.served_model_name or model_dir.name,
        max_model_len=context_length(model_config,
                                     config.max_model_len), vocab_size=model_config.vocab_size,
        orchestrator=Orchestrator(
            config.router, config.max_migrations,
            PrefillDeadline(config.prefill_timeout_slo_factor, config.prefill_timeout_s)),
        keys=keys,
        metrics=GatewayMetrics(registry), registry=registry, limiter=RateLimiter(),
        tool_parser=parser_for_model(config.tool_call_parser, model_config.model_type, tokenizer))


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


async def serve(config: GatewayConfig) -> int:
    setup_tracing("baton-gateway")
    gateway = build_gateway(config)
    sock = listen_socket(config.host, config.port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(gateway), log_level="warning", timeout_graceful_shutdown=30))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        # The one line launchers and tests wait for.
        print(
            f"baton gateway ready: address={config.host}:{port} url=http://{config.host}:{port}/v1 "
            f"model={gateway.model_name}", flush=True)
    await task
    return 0

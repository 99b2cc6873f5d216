"""KV transports: how a decode worker reads a prefill worker's KV blocks (see base.py for the contract)."""
from __future__ import annotations

from typing import Literal

import torch
from prometheus_client import CollectorRegistry

from baton.services.worker.kv_transfer.base import KVLayout, KVPeer, KVTransferError, KVTransport, TransferResult
from baton.services.worker.kv_transfer.telemetry import TransferMetrics

__all__ = ["KVLayout", "KVPeer", "KVTransferError", "KVTransport", "TransferResult", "make_transport"]


def make_transport(kind: Literal["nixl", "grpc"], kv_cache: torch.Tensor, name: str, host: str, port: int,
                   registry: CollectorRegistry | None = None, metrics: bool = True) -> KVTransport:
    """One transport over this worker's cache. `name` is the NIXL agent name (unique per worker process) and the
    worker's id for gRPC; `port` is the NIXL metadata listener's port, or for gRPC the worker's own gRPC port,
    which the worker's server answers PullKV on. Metrics go to `registry` (default: prometheus_client's)."""
    transfer_metrics = TransferMetrics.for_registry(registry) if metrics else None
    if kind == "nixl":
        # Imported here so a worker on the gRPC transport never loads NIXL (or needs it installed).
        from baton.services.worker.kv_transfer.nixl_transport import NixlKVTransport
        return NixlKVTransport(kv_cache, name, host, port, transfer_metrics)
    if kind == "grpc":
        from baton.services.worker.kv_transfer.grpc_transport import GrpcKVTransport
        return GrpcKVTransport(kv_cache, name, host, port, transfer_metrics)
    raise ValueError(f"unknown KV transport {kind!r}: expected 'nixl' or 'grpc'")

"""KV transports: how a decode worker reads a prefill worker's KV blocks over the network or between
processes (see base.py for the contract). The cache they move, its layout and block copies are the
engine's (baton.services.engine.kv)."""
from __future__ import annotations

from typing import Any, Literal

import torch
from prometheus_client import CollectorRegistry

from baton.services.worker.kv_transfer.base import (KVPeer, KVTransferError, KVTransport,
                                                    TransferResult)
from baton.services.worker.kv_transfer.telemetry import TransferMetrics

__all__ = [
    "KVPeer", "KVTransferError", "KVTransport", "TRANSPORT_KINDS", "TransferResult",
    "TransportKind", "make_transport"
]


TransportKind = Literal["nixl", "grpc", "cuda_ipc"]
TRANSPORT_KINDS: tuple[str, ...] = ("nixl", "grpc", "cuda_ipc")


def make_transport(kind: TransportKind, kv_cache: torch.Tensor, name: str, host: str, port: int,
                   registry: CollectorRegistry | None = None, metrics: bool = True,
                   ucx_tls: str | None = None, heads: tuple[int, int] | None = None,
                   executor: Any = None, head_cache: torch.Tensor | None = None) -> KVTransport:
    """One transport over this worker's cache. `name` is the NIXL agent name (unique per worker
    process) and the worker's id for gRPC; `port` is the NIXL metadata (or CUDA IPC handle)
    listener's port, or for gRPC the worker's own gRPC port, which the worker's server answers
    PullKV on. Metrics go to `registry` (default: prometheus_client's). `ucx_tls` overrides UCX_TLS
    for NIXL over a CUDA cache. Given the model's (query heads, KV heads), NIXL hands off across
    tensor-parallel sizes (head_transport.py), its other ranks reached through `executor` (the
    engine's, at TP>1). `head_cache`: an EAGLE head's cache (rank 0's), moved with the target's
    blocks when the peer has one of the same shape (NIXL and gRPC; CUDA IPC moves the target's
    alone)."""
    transfer_metrics = TransferMetrics.for_registry(registry) if metrics else None
    if kind == "nixl":
        # Imported here so a worker on the gRPC transport never loads NIXL (or needs it installed).
        from baton.services.worker.kv_transfer.head_transport import HeadShardedTransport
        from baton.services.worker.kv_transfer.nixl_transport import NixlKVTransport
        inner = NixlKVTransport(kv_cache, name, host, port, transfer_metrics, ucx_tls,
                                head_cache)
        if heads is None:
            return inner
        try:
            return HeadShardedTransport(inner, heads, executor, transfer_metrics, ucx_tls)
        except BaseException:
            inner.close()
            raise
    if kind == "cuda_ipc":
        from baton.services.worker.kv_transfer.cuda_ipc import CudaIpcKVTransport
        return CudaIpcKVTransport(kv_cache, name, host, port, transfer_metrics)
    if kind == "grpc":
        from baton.services.worker.kv_transfer.grpc_transport import GrpcKVTransport
        return GrpcKVTransport(kv_cache, name, host, port, transfer_metrics, head_cache)
    raise ValueError(f"unknown KV transport {kind!r}: expected one of {', '.join(TRANSPORT_KINDS)}")

"""The worker's one typed configuration (flags: `--role`, env: `BATON_ROLE`, ...); engine settings
are separate (baton.services.engine.config.EngineConfig)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from baton.services.common.roles import RoleName
from baton.services.common.settings import BatonSettings


class WorkerConfig(BatonSettings):
    role: RoleName = Field("mixed", description="Which phases this worker serves")
    host: str = Field("127.0.0.1", description="Address the gRPC service listens on")
    port: int = Field(50051, ge=0, le=65535,
                      description="gRPC port (0: any free port, printed at start)")
    advertise_host: str | None = Field(
        None,
        description="Host other workers use to reach this one (default: host; the pod IP "
                    "in a cluster)")
    worker_id: str | None = Field(
        None, description="Stable identity in KV handles and stats (default: host:port)")
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="HTTP port for /metrics, /health and /ready (unset: no HTTP server)")
    router: str | None = Field(
        None,
        description="host:port of a router to register with and heartbeat (unset: the router finds "
                    "this worker from its static list or EndpointSlices)")
    kv_transport: Literal["nixl", "grpc", "cuda_ipc"] = Field(
        "nixl",
        description="How decode workers pull KV blocks: NIXL (UCX), block bytes over gRPC "
                    "streaming, or cuda_ipc (same-node GPU caches copied directly, no UCX; CUDA "
                    "caches only)")
    kv_port: int | None = Field(
        None, ge=0, le=65535,
        description="NIXL metadata (or CUDA IPC handle) listener port (default: the gRPC port + 1)")
    kv_ucx_tls: str | None = Field(
        None,
        description="UCX_TLS for NIXL over a CUDA cache (default: UCX_TLS if set, else "
                    "cuda_ipc,cuda_copy,sm,tcp,self); add rc for GPUDirect RDMA between nodes")
    lease_seconds: float = Field(
        30.0, gt=0,
        description="How long a prefill worker holds a prompt's blocks for its decode worker")
    transfer_timeout_seconds: float = Field(
        10.0, gt=0, description="A KV read slower than this counts as failed")
    transfer_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description="After a failed KV read: compute the prompt locally, or fail the request")
    drain_grace_seconds: float = Field(
        60.0, ge=0,
        description="On SIGTERM, how long in-flight requests may take to finish before exit")
    kv_event_buffer: int = Field(
        100_000, ge=1,
        description="KV events kept for consumers that reconnect; older gaps need a snapshot")

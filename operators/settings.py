"""The operator's settings: each field is a BATON_* environment variable and a `baton operator
--flag`."""
from __future__ import annotations

from pydantic import Field

from baton.services.common.settings import BatonSettings


class OperatorSettings(BatonSettings):
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch; empty watches the whole cluster")
    autoscale_interval_seconds: float = Field(5.0, gt=0, le=300,
                                              description="How often each pool's autoscaler runs")
    prometheus_url: str | None = Field(
        None,
        description="Prometheus HTTP API for autoscaler signals; unset reads each router's stats "
                    "endpoint")
    router_stats_path: str = Field("/stats", description="Path of the router's JSON stats endpoint")
    router_drain_path: str = Field("/admin/drain",
                                   description="Path of the router's drain endpoint (POST)")
    signal_timeout_seconds: float = Field(2.0, gt=0, le=60,
                                          description="Timeout of one signal or drain request")
    router_image: str = Field("ghcr.io/baton-serving/baton-router:0.1.0",
                              description="Router image for deployments that name none")
    gateway_image: str = Field("ghcr.io/baton-serving/baton-gateway:0.1.0",
                               description="Gateway image for deployments that name none")
    worker_port: int = Field(8100, ge=1024, le=65535,
                             description="Workers' gRPC port (NIXL listens on the next one)")
    probe_port: int = Field(
        9100, ge=1024, le=65535,
        description="Port of the workers', routers' and gateways' HTTP server: /metrics, "
                    "/health, /ready, and the router's /stats and /admin/drain (a gateway's API "
                    "has its own port)")
    ray_port: int = Field(
        6379, ge=1024, le=65535,
        description="Port of the Ray head (GCS) that the leader of a LeaderWorkerSet group starts "
                    "and its other pods join")
    worker_startup_timeout_seconds: int = Field(
        3600, ge=60, le=86400,
        description="How long a worker may take to first answer /health (model load; in a "
                    "LeaderWorkerSet group also every node joining) before the kubelet restarts it")
    metrics_port: int = Field(9090, ge=0, le=65535,
                              description="Port of the operator's /metrics; 0 disables it")
    health_port: int = Field(8080, ge=0, le=65535,
                             description="Port of the operator's /healthz; 0 disables it")

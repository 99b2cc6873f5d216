"""The worker's own Prometheus metrics (request latencies and the KV hand-off), beside the engine's
collector.

Latency histograms use vLLM's names (with the `baton_` prefix), meanings and buckets;
docs/metrics.md lists them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from baton.services.common.latency_buckets import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name"]
        self.model_name = model_name
        self.ttft = Histogram("baton_time_to_first_token_seconds",
                              "Time from request arrival to its first token", labels,
                              buckets=TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("baton_inter_token_latency_seconds",
                             "Time between consecutive output tokens", labels, buckets=ITL_BUCKETS,
                             registry=registry)
        self.e2e = Histogram("baton_e2e_request_latency_seconds",
                             "Time from request arrival to its last token", labels,
                             buckets=E2E_BUCKETS, registry=registry)
        self.finished = Counter("baton_request_success", "Requests finished, by finish reason",
                                labels + ["finished_reason"], registry=registry)
        self.lease_expiries = Counter("baton_kv_lease_expiries",
                                      "Held KV blocks freed because their lease expired", labels,
                                      registry=registry)
        self.kv_fallbacks = Counter(
            "baton_kv_transfer_fallbacks",
            "Hand-offs whose KV read failed, by what happened next (recompute or fail)",
            labels + ["policy"], registry=registry)
        self.leases = Gauge("baton_kv_leases",
                            "KV hand-offs whose blocks are held for a decode worker", labels,
                            registry=registry)
        self.draining = Gauge("baton_worker_draining", "1 while the worker drains before exiting",
                              labels, registry=registry)

"""The gateway's Prometheus metrics: client-facing latencies, SLO attainment and goodput, per-tenant
metering.

Goodput is counted as tokens delivered by requests that met both their TTFT and TPOT targets
(DistServe's definition, per request); attainment is `baton_slo_requests_total{met="true"}` over
all. docs/metrics.md lists them.
"""
from __future__ import annotations

import hashlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from baton.services.common.latency_buckets import E2E_BUCKETS
from baton.services.gateway.config import SLO

# The SLO histograms: four buckets per doubling from 1 ms to 262 s. A quantile interpolated inside a
# bucket is then off by at most 19% of its value and typically a few percent, where vLLM's buckets
# (kept on the workers, for its dashboards) are 25-50 ms wide at the latencies small models and CPUs
# give, too coarse to check an SLO against.
LATENCY_BUCKETS = tuple(round(0.001 * 2 ** (i / 4), 6) for i in range(73))
ALL_TENANTS = "all"


def tenant_label(mode: str, tenant: str) -> str:
    """The `tenant` label value: the name, a short stable digest of it (the same on every replica
    and restart, so per-tenant series and dashboards still work without naming customers), or one
    value for all."""
    if mode == "hash":
        return hashlib.sha256(tenant.encode()).hexdigest()[:12]
    return ALL_TENANTS if mode == "off" else tenant


class GatewayMetrics:
    IN_FLIGHT = "baton_gateway_requests_in_flight"  # /load reads it

    def __init__(self, registry: CollectorRegistry, tenant_labels: str = "name") -> None:
        self.tenant_labels = tenant_labels
        self.requests = Counter("baton_gateway_requests",
                                "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=registry)
        self.ttft = Histogram(
            "baton_gateway_time_to_first_token_seconds",
            "Client-facing time to first token (arrival at the gateway to first token sent)",
            buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("baton_gateway_inter_token_latency_seconds",
                             "Client-facing time between streamed tokens", buckets=LATENCY_BUCKETS,
                             registry=registry)
        self.tpot = Histogram("baton_gateway_time_per_output_token_seconds",
                              "Per request: (E2E - TTFT) / (output tokens - 1)",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("baton_gateway_e2e_request_latency_seconds",
                             "Client-facing end-to-end latency", buckets=E2E_BUCKETS,
                             registry=registry)
        self.slo = Counter("baton_slo_requests",
                           "Finished requests, by priority and whether they met the SLO",
                           ["priority", "met"], registry=registry)
        self.goodput = Counter("baton_goodput_tokens",
                               "Output tokens of requests that met their SLO", ["priority"],
                               registry=registry)
        self.prompt_tokens = Counter("baton_tenant_prompt_tokens",
                                     "Prompt tokens served, per tenant", ["tenant"],
                                     registry=registry)
        self.completion_tokens = Counter("baton_tenant_completion_tokens",
                                         "Completion tokens served, per tenant", ["tenant"],
                                         registry=registry)
        self.rejections = Counter("baton_gateway_rejections", "Requests refused, by reason",
                                  ["reason"], registry=registry)
        self.migrations = Counter("baton_gateway_migrations",
                                  "Streams moved to another decode worker", registry=registry)
        self.in_flight = Gauge(self.IN_FLIGHT, "Requests being served",
                               registry=registry)
        self.router_up = Gauge("baton_gateway_router_up",
                               "1 while the router answers its health check", registry=registry)
        self.key_reloads = Counter("baton_gateway_api_key_reloads",
                                   "Reloads of the API-keys file, by result (ok, error)",
                                   ["result"], registry=registry)
        self.client_timeouts = Counter(
            "baton_gateway_client_timeouts",
            "Connections closed because a request's head or body came too slowly, by phase",
            ["phase"], registry=registry)
        self._add_store_metrics(registry)

    def _add_store_metrics(self, registry: CollectorRegistry) -> None:
        """The shared stores' metrics: the rate-limit store's and the state store's."""
        self.rate_limit_store_errors = Counter(
            "baton_gateway_rate_limit_store_errors",
            "Rate-limit store calls that failed, by what was decided: admitted (failing open), "
            "refused (failing closed, 503) or settlement_lost (a finished request's unused "
            "tokens not given back)", ["decision"], registry=registry)
        self.rate_limit_store_up = Gauge(
            "baton_gateway_rate_limit_store_up",
            "0 while the rate-limit store fails to answer, else 1", registry=registry)
        self.reserved_tokens = Gauge(
            "baton_gateway_rate_limit_reserved_tokens",
            "Tokens reserved by admitted requests that have not ended yet (each is settled to "
            "what it used when it ends)", registry=registry)
        self.state_store_failures = Counter(
            "baton_gateway_state_store_failures",
            "State-store operations that failed (the store unreachable), by operation",
            ["operation"], registry=registry)

    def tenant(self, name: str) -> str:
        return tenant_label(self.tenant_labels, name)

    def finish_choice(self, priority: int, slo: SLO | None, ttft_s: float | None, e2e_s: float,
                      tokens: int) -> None:
        """One finished choice: latency histograms, SLO verdict and goodput."""
        self.e2e.observe(e2e_s)
        tpot_s = (e2e_s - ttft_s) / (tokens - 1) if ttft_s is not None and tokens > 1 else None
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        if slo is None:
            return
        met = (ttft_s is not None and ttft_s * 1000 <= slo.ttft_ms
               and (tpot_s is None or tpot_s * 1000 <= slo.tpot_ms))
        self.slo.labels(str(priority), "true" if met else "false").inc()
        if met:
            self.goodput.labels(str(priority)).inc(tokens)

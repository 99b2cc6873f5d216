"""Where a pool's load comes from: Prometheus when configured, else the router's JSON stats
endpoint.

The router's endpoint (GET {routerUrl}{--router-stats-path},
baton.services.router.server.stats_json) answers
    {"pools": {"prefill": {"workers": 2, "queued_prefill_tokens": 900, "inflight_requests": 7,
                           "mean_kv_utilization": 0.4, "saturated": 0},
               "decode": {...}, "mixed": {...}},
     "models": {"qwen": {"pools": {...}}, "coder": {"pools": {...}}},
     "queued_requests": 3, "leases": 12}
A pool is found by its model (a router serves a BatonDeployment and its gatewayRef members, and
`pools` sums their models) and its role. Only the load signals the
router knows come from it (KV usage, running and waiting requests); the rate and latency signals
need Prometheus.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from baton.operators.autoscaler.policy import Signals

log = logging.getLogger(__name__)
FIELDS = {f.name for f in dataclasses.fields(Signals)}

# One instant query per signal. {pool} selects the pool's workers, {deployment} the whole
# BatonDeployment (gateway metrics carry no pool); the labels come from the
# ServiceMonitor/PodMonitor relabelings.
PROMQL = {
    # The router's admission queue: requests wait there when no worker has room (it has no per-pool
    # split).
    "queue_time_p95_s": "histogram_quantile(0.95, sum by (le) "
                        "(rate(baton_router_queue_time_seconds_bucket{{{deployment}}}[2m])))",
    "prompt_tokens_per_s": "sum(rate(baton_prompt_tokens_computed_total{{{pool}}}[2m]))",
    "prefill_capacity_tokens_per_s":
        "max_over_time((sum(rate(baton_prompt_tokens_computed_total{{{pool}}}[1m]))"
        " / count(baton_num_requests_running{{{pool}}}))[1h:1m])",
    "kv_cache_usage": "avg(baton_kv_cache_usage_perc{{{pool}}})",
    "tpot_attainment": 'sum(rate(baton_slo_requests_total{{{deployment},met="true"}}[5m]))'
                       ' / sum(rate(baton_slo_requests_total{{{deployment}}}[5m]))',
    "goodput_tokens_per_s": "sum(rate(baton_goodput_tokens_total{{{deployment}}}[2m]))",
    "running_requests": "sum(baton_num_requests_running{{{pool}}})",
    "waiting_requests": "sum(baton_num_requests_waiting{{{pool}}})",
}


@dataclass(frozen=True)
class PoolRef:
    namespace: str
    name: str
    deployment: str
    router_url: str
    role: str
    # The served model name its workers serve: a router in front of several models reports each
    # one's pools apart.
    model: str = ""


class SignalSource(Protocol):
    async def fetch(self, pool: PoolRef) -> Signals: ...


def signals_from(values: dict[str, Any]) -> Signals:
    return Signals(**{k: float(v) for k, v in values.items() if k in FIELDS and v is not None})


class RouterStatsSource:
    def __init__(self, session: aiohttp.ClientSession, path: str = "/stats") -> None:
        self.session, self.path = session, path

    async def fetch(self, pool: PoolRef) -> Signals:
        async with self.session.get(pool.router_url.rstrip("/") + self.path) as response:
            response.raise_for_status()
            stats = await response.json()
        return router_signals(stats, pool.role, pool.model)


def router_signals(stats: dict[str, Any], role: str, model: str = "") -> Signals:
    """The router's /stats JSON -> the role's Signals, from the model's own pools where the router
    reports them (several models behind it), else from the sum. Requests the router holds count as
    waiting for every pool: a queued request waits for whichever pool lacks room, and a pool at
    zero replicas must wake for them."""
    pools = stats.get("models", {}).get(model, {}).get("pools") or stats.get("pools", {})
    pool = pools.get(role)
    if pool is None:
        return Signals()
    return signals_from({"kv_cache_usage": pool.get("mean_kv_utilization"),
                         "running_requests": pool.get("inflight_requests"),
                         "waiting_requests": stats.get("queued_requests")})


def promql(pool: PoolRef) -> dict[str, str]:
    return {
        name: query.format(
            pool=f'namespace="{pool.namespace}",pool="{pool.name}"',
            deployment=f'namespace="{pool.namespace}",deployment="{pool.deployment}"')
        for name, query in PROMQL.items()
    }


class PrometheusSource:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url.rstrip("/")

    async def _query(self, expression: str) -> float | None:
        async with self.session.get(f"{self.url}/api/v1/query",
                                    params={"query": expression}) as response:
            response.raise_for_status()
            body = await response.json()
        result = body.get("data", {}).get("result", [])
        value = float(result[0]["value"][1]) if result else None
        return None if value is None or value != value else value  # NaN: no data (e.g. 0/0)

    async def fetch(self, pool: PoolRef) -> Signals:
        queries = promql(pool)
        values = await asyncio.gather(*(self._query(q) for q in queries.values()))
        return signals_from(dict(zip(queries, values)))

"""Where a pool's load comes from: Prometheus when configured, else the router's JSON stats endpoint.

The router's endpoint (GET {routerUrl}{--router-stats-path}) answers
    {"pools": {"<WorkerPool name>": {"queue_time_p95_s": 0.2, "kv_cache_usage": 0.7, ...}}}
with any subset of the `Signals` field names per pool; unknown fields are ignored.
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

# One instant query per signal. {pool} selects the pool's workers, {deployment} the whole BatonDeployment
# (gateway metrics carry no pool); the labels come from the ServiceMonitor/PodMonitor relabelings.
PROMQL = {
    "queue_time_p95_s":
        "histogram_quantile(0.95, sum by (le) (rate(baton_request_queue_time_seconds_bucket{{{pool}}}[2m])))",
    "prompt_tokens_per_s": "sum(rate(baton_prompt_tokens_total{{{pool}}}[2m]))",
    "prefill_capacity_tokens_per_s":
        "max_over_time((sum(rate(baton_prompt_tokens_total{{{pool}}}[1m]))"
        " / count(baton_num_requests_running{{{pool}}}))[1h:1m])",
    "kv_cache_usage": "avg(baton_kv_cache_usage_perc{{{pool}}})",
    "tpot_attainment":
        'sum(rate(baton_slo_requests_total{{{deployment},met="true"}}[5m]))'
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
        return signals_from(stats.get("pools", {}).get(pool.name, {}))


def promql(pool: PoolRef) -> dict[str, str]:
    return {name: query.format(pool=f'namespace="{pool.namespace}",pool="{pool.name}"',
                               deployment=f'namespace="{pool.namespace}",deployment="{pool.deployment}"')
            for name, query in PROMQL.items()}


class PrometheusSource:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url.rstrip("/")

    async def _query(self, expression: str) -> float | None:
        async with self.session.get(f"{self.url}/api/v1/query", params={"query": expression}) as response:
            response.raise_for_status()
            body = await response.json()
        result = body.get("data", {}).get("result", [])
        value = float(result[0]["value"][1]) if result else None
        return None if value is None or value != value else value  # NaN: no data (e.g. 0/0)

    async def fetch(self, pool: PoolRef) -> Signals:
        queries = promql(pool)
        values = await asyncio.gather(*(self._query(q) for q in queries.values()))
        return signals_from(dict(zip(queries, values)))

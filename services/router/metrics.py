"""The router's Prometheus metrics, created on a registry the caller owns (tests use a private
one)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from baton.services.router.rejections import RejectReason

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def priority_class(priority: int) -> str:
    """Priorities are open-ended integers; labels need a bounded set."""
    return "sheddable" if priority < 0 else "standard" if priority == 0 else "critical"


@dataclass(frozen=True)
class WorkerLoadRow:
    worker_id: str
    queued_prefill_tokens: int
    inflight_requests: int
    kv_utilization: float
    stats_age_s: float


class _WorkerLoadCollector(Collector):
    """Per-worker load as this router sees it, read at scrape time so decisions pay nothing for
    it."""

    def __init__(self, rows: Callable[[], Iterable[WorkerLoadRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        families = {
            "queued_prefill_tokens": GaugeMetricFamily(
                "baton_router_worker_queued_prefill_tokens",
                "Prompt tokens queued on the worker, incl. own placements", labels=["worker"]),
            "inflight_requests": GaugeMetricFamily(
                "baton_router_worker_inflight_requests",
                "Requests on the worker, incl. own unreported placements", labels=["worker"]),
            "kv_utilization": GaugeMetricFamily("baton_router_worker_kv_utilization",
                                                "Used share of the worker's KV cache",
                                                labels=["worker"]),
            "stats_age_s": GaugeMetricFamily("baton_router_worker_stats_age_seconds",
                                             "Age of the worker's last stats report",
                                             labels=["worker"]),
        }
        for row in self._rows():
            for attr, family in families.items():
                family.add_metric([row.worker_id], float(getattr(row, attr)))
        yield from families.values()


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rejections = Counter("baton_router_rejections", "Requests refused, by reason",
                                  ["reason"], registry=registry)
        for reason in RejectReason:
            self.rejections.labels(reason.value)
        self.decisions = Counter("baton_router_decisions",
                                 "Placement decisions, by outcome and reason",
                                 ["outcome", "reason"], registry=registry)
        self.decision_latency = Histogram("baton_router_decision_latency_seconds",
                                          "Time to decide one placement", buckets=_LATENCY_BUCKETS,
                                          registry=registry)
        self.prompt_tokens = Counter("baton_router_prompt_tokens",
                                     "Prompt tokens of placed requests", registry=registry)
        self.predicted_cached_tokens = Counter(
            "baton_router_predicted_cached_tokens",
            "Prompt tokens the index predicted cached where requests were placed (hit ratio = this "
            "/ prompt tokens)",
            registry=registry)
        self.queue_time = Histogram("baton_router_queue_time_seconds",
                                    "Time placed requests waited in the queue", ["priority"],
                                    buckets=_QUEUE_BUCKETS, registry=registry)
        self.observed_ttft = Histogram(
            "baton_router_observed_ttft_seconds",
            "Placement to first token as gateways reported it on release, by the worker that "
            "prefilled (what the TTFT predictor learns from)", ["worker"], buckets=_TTFT_BUCKETS,
            registry=registry)

    def watch_workers(self, rows: Callable[[], Iterable[WorkerLoadRow]]) -> None:
        self.registry.register(_WorkerLoadCollector(rows))

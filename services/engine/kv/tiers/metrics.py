"""Prometheus families of the KV tiers, one series per tier (`tier` = host, disk). Exported by
every engine, zero where a tier is off, so dashboards and alerts need not know which workers have
one. Names follow vLLM's prefix-cache metrics; docs/metrics.md lists them."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from baton.services.engine.kv.tiers.manager import TierManager
from baton.services.engine.kv.tiers.stats import TierStats

TIERS = ("host", "disk")
# (name, help, TierStats field)
COUNTERS = (
    ("baton_kv_tier_queries", "Prompt tokens looked up in a KV tier (those the tiers above missed)",
     "queries"),
    ("baton_kv_tier_hits", "Of those, tokens found in the tier", "hits"),
    ("baton_kv_tier_stored_bytes", "Bytes copied into a KV tier", "bytes_stored"),
    ("baton_kv_tier_store_seconds", "Seconds spent copying blocks into a KV tier",
     "seconds_stored"),
    ("baton_kv_tier_loaded_bytes", "Bytes loaded from a KV tier into device blocks",
     "bytes_loaded"),
    ("baton_kv_tier_load_seconds", "Seconds spent loading blocks from a KV tier", "seconds_loaded"),
    ("baton_kv_tier_checksum_failures", "Block files refused on read (deleted, treated as a "
     "miss); under tensor parallelism, on any rank", "checksum_failures"),
    ("baton_kv_tier_write_errors", "Writes to a KV tier that failed (the disk tier then stops "
     "writing)", "write_errors"),
)


def tier_metrics(tiers: TierManager | None, model_name: str) -> Iterator[Metric]:
    stats = tiers.stats if tiers is not None else {t: TierStats() for t in TIERS}
    usage = tiers.usage() if tiers is not None else {}
    labels = ["model_name", "tier"]
    for name, doc, field in COUNTERS:
        family = CounterMetricFamily(name, doc, labels=labels)
        for tier in TIERS:
            family.add_metric([model_name, tier], getattr(stats[tier], field))
        yield family
    used = GaugeMetricFamily("baton_kv_tier_usage_bytes", "Bytes a KV tier holds", labels=labels)
    allowed = GaugeMetricFamily("baton_kv_tier_capacity_bytes",
                                "Bytes a KV tier may hold (0 = off)", labels=labels)
    for tier in TIERS:
        have, most = usage.get(tier, (0, 0))
        used.add_metric([model_name, tier], have)
        allowed.add_metric([model_name, tier], most)
    yield used
    yield allowed

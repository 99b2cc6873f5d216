"""Prometheus view of an engine, read at scrape time so the token path pays nothing for it.

Names follow vLLM's metrics with a `baton_` prefix (vllm:num_preemptions ->
baton_num_preemptions_total); docs/metrics.md lists them.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from baton.services.engine.kv.tiers.metrics import tier_metrics
from baton.services.engine.speculation.stats import SpecDecodeStats

if TYPE_CHECKING:
    from baton.services.engine.llm_engine import LLMEngine


def _spec_decode(stats: SpecDecodeStats, label: dict[str, str]) -> Iterator[Metric]:
    """vLLM's vllm:spec_decode_* counters; the acceptance rate is accepted over draft tokens."""
    names = list(label)
    for name, doc, value in (
            ("num_drafts", "Drafts verified (sequence-steps that speculated)", stats.num_drafts),
            ("num_draft_tokens", "Draft tokens proposed", stats.num_draft_tokens),
            ("num_accepted_tokens", "Draft tokens accepted", stats.num_accepted_tokens)):
        family = CounterMetricFamily(f"baton_spec_decode_{name}", doc, labels=names)
        family.add_metric(list(label.values()), value)
        yield family
    family = CounterMetricFamily("baton_spec_decode_num_accepted_tokens_per_pos",
                                 "Drafts whose token at this position was accepted",
                                 labels=names + ["position"])
    for position, value in enumerate(stats.accepted_per_pos):
        family.add_metric(list(label.values()) + [str(position)], value)
    yield family


class EngineCollector(Collector):
    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        label = {"model_name": e.model_id}
        stats, counters, sched = e.scheduler.stats, e.counters, e.scheduler

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=list(label))
            family.add_metric(list(label.values()), value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=list(label))
            family.add_metric(list(label.values()), value)
            return family

        yield counter("baton_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                      stats.prefix_cache_queries)
        yield counter("baton_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                      stats.prefix_cache_hits)
        yield counter("baton_num_preemptions",
                      "Requests preempted (KV blocks reclaimed, recomputed later)",
                      stats.preemptions)
        yield counter("baton_num_preemptions_swapped",
                      "Of the preemptions, those whose full blocks went to the host tier "
                      "(swap) rather than being dropped", stats.preemptions_swapped)
        yield from tier_metrics(e.tiers, e.model_id)
        yield counter("baton_prompt_tokens_computed",
                      "Prompt tokens run through the model (cache hits excluded)",
                      counters.prompt_tokens_computed)
        yield counter("baton_generation_tokens", "Tokens generated", counters.generation_tokens)
        yield counter("baton_engine_steps", "Engine steps (forward passes) run", counters.steps)
        # Zeros when speculation is off, so that dashboards read one set of series everywhere.
        yield from _spec_decode(
            SpecDecodeStats() if e.speculator is None else e.speculator.stats, label)
        yield gauge("baton_num_requests_running", "Requests in the running batch",
                    len(sched.running))
        yield gauge("baton_num_requests_waiting", "Requests waiting to be scheduled",
                    len(sched.waiting))
        yield gauge("baton_kv_cache_usage_perc", "Share of KV-cache blocks in use (1 = full)",
                    e.blocks.usage)
        yield gauge("baton_kv_cache_free_blocks", "KV-cache blocks free or evictable",
                    e.blocks.num_free_blocks)
        yield gauge("baton_kv_cache_total_blocks", "KV-cache blocks in all", e.blocks.num_blocks)
        if e.lora is not None:
            yield from _lora_metrics(e, label)


def _lora_metrics(e: "LLMEngine", label: dict[str, str]) -> Iterator[Metric]:
    """vLLM's lora_requests_info (the adapters running and waiting as labels, its value the time
    read), and each adapter's tokens, which a tenant's bill counts."""
    stats = e.lora.stats()
    info = GaugeMetricFamily(
        "baton_lora_requests_info", "LoRA adapters of running and waiting requests",
        labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    info.add_metric([str(stats.max_loras), ",".join(sorted(e.scheduler.running_loras())),
                     ",".join(sorted(e.scheduler.waiting_loras()))], time.time())
    yield info
    for name, doc, counts in (
            ("baton_lora_prompt_tokens", "Prompt tokens computed under each LoRA adapter",
             stats.prompt_tokens),
            ("baton_lora_generation_tokens", "Tokens generated under each LoRA adapter",
             stats.generation_tokens)):
        family = CounterMetricFamily(name, doc, labels=[*label, "lora_name"])
        for adapter in stats.registered:
            family.add_metric([*label.values(), adapter], counts.get(adapter, 0))
        yield family
    yield CounterMetricFamily("baton_lora_slot_loads",
                              "LoRA adapters copied into a device slot (a reload counts again)",
                              value=stats.slot_loads)

"""vLLM's metric names beside Baton's, for the tools that only read `vllm:*`: Grafana dashboards,
HPA/KEDA rules, llm-d's endpoint picker.

Each `vllm:` family is a renamed copy of a Baton family, taken at scrape time from the very
collector that produces the Baton one (the engine's counters, the worker's histograms): nothing is
counted twice, and the two names cannot disagree. Labels (`model_name`, ...) are kept as they are.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

# vLLM name -> the Baton family it copies (counters by their family name, without `_total`).
VLLM_NAMES = {
    "vllm:num_requests_running": "baton_num_requests_running",
    "vllm:num_requests_waiting": "baton_num_requests_waiting",
    "vllm:kv_cache_usage_perc": "baton_kv_cache_usage_perc",
    "vllm:prefix_cache_queries": "baton_prefix_cache_queries",
    "vllm:prefix_cache_hits": "baton_prefix_cache_hits",
    # vLLM counts each request's whole prompt, cached tokens included: exactly the tokens the
    # prefix cache is asked about (not baton_prompt_tokens_computed, which leaves the hits out).
    "vllm:prompt_tokens": "baton_prefix_cache_queries",
    "vllm:generation_tokens": "baton_generation_tokens",
    "vllm:num_preemptions": "baton_num_preemptions",
    "vllm:time_to_first_token_seconds": "baton_time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds": "baton_inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds": "baton_e2e_request_latency_seconds",
    "vllm:request_success": "baton_request_success",
    "vllm:lora_requests_info": "baton_lora_requests_info",
}


def renamed(family: Metric, name: str) -> Metric:
    """A copy of `family` under `name`, each sample's suffix (_total, _bucket, ...) kept."""
    copy = Metric(name, family.documentation, family.type, family.unit)
    copy.samples = [sample._replace(name=copy.name + sample.name[len(family.name):])
                    for sample in family.samples]
    return copy


class VllmNames(Collector):
    """Yields the VLLM_NAMES copies of what `sources` collect (the sources stay registered under
    their own names too)."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        families = {family.name: family for source in self.sources for family in source.collect()}
        for vllm_name, baton_name in VLLM_NAMES.items():
            family = families.get(baton_name)
            if family is not None:
                yield renamed(family, vllm_name)

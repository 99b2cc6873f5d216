"""A live worker's /metrics carries vLLM's names beside Baton's, from the same counters: after two
requests (the second a prefix-cache hit) each `vllm:` series equals its Baton twin in the same
scrape, with the `model_name` label, vLLM's types and vLLM's TTFT buckets."""
from __future__ import annotations

import asyncio
import urllib.request

import pytest

from tests.launcher import sample_sum, start_workers, stop_all
from tests.worker.streams import collect, greedy_params

# The series other tools read, by their vLLM name, and the Baton series each must equal.
TWINS = {
    "vllm:num_requests_running": "baton_num_requests_running",
    "vllm:num_requests_waiting": "baton_num_requests_waiting",
    "vllm:kv_cache_usage_perc": "baton_kv_cache_usage_perc",
    "vllm:prompt_tokens_total": "baton_prefix_cache_queries_total",
    "vllm:generation_tokens_total": "baton_generation_tokens_total",
    "vllm:prefix_cache_queries_total": "baton_prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "baton_prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds_count": "baton_time_to_first_token_seconds_count",
    "vllm:time_to_first_token_seconds_sum": "baton_time_to_first_token_seconds_sum",
    "vllm:inter_token_latency_seconds_count": "baton_inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum": "baton_inter_token_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count": "baton_e2e_request_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_bucket": "baton_e2e_request_latency_seconds_bucket",
}
# Those that must have counted something after two requests.
NONZERO = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
           "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_count",
           "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count")
TYPES = {"vllm:num_requests_running": "gauge", "vllm:kv_cache_usage_perc": "gauge",
         "vllm:prompt_tokens_total": "counter", "vllm:prefix_cache_hits_total": "counter",
         "vllm:time_to_first_token_seconds": "histogram",
         "vllm:inter_token_latency_seconds": "histogram",
         "vllm:e2e_request_latency_seconds": "histogram"}
# vLLM's own (vllm/v1/metrics/loggers.py)
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, float("inf")]


@pytest.fixture(scope="module")
def page(tiny_model_dirs) -> str:
    """The worker's /metrics after two requests with the same 40-token prompt."""
    [worker] = start_workers(tiny_model_dirs["llama"], ["mixed"])
    try:
        prompt = list(range(1, 41))
        for i in range(2):
            tokens, _ = asyncio.run(collect(worker, None, f"vllm-names-{i}", prompt,
                                            greedy_params(6)))
            assert len(tokens) == 6
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        stop_all([worker.service])


@pytest.mark.parametrize("vllm_name", TWINS)
def test_vllm_name_equals_its_baton_twin(page: str, vllm_name: str) -> None:
    assert f"\n{vllm_name}{{" in page, f"{vllm_name} is not exported"
    value = sample_sum(page, vllm_name, model_name="llama")
    assert value == sample_sum(page, TWINS[vllm_name], model_name="llama")
    if vllm_name in NONZERO:
        assert value > 0


def test_vllm_types_and_buckets(page: str) -> None:
    for name, kind in TYPES.items():
        assert f"# TYPE {name} {kind}\n" in page
    bounds = [line.split('le="')[1].split('"')[0] for line in page.splitlines()
              if line.startswith("vllm:time_to_first_token_seconds_bucket{")]
    assert [float(b) for b in bounds] == VLLM_TTFT_BUCKETS

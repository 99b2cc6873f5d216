"""Every metric the Grafana dashboards and the autoscaler's PromQL name is exported by some process
of a live stack (gateway, router, each worker), after a little traffic; dashboards/metrics.txt lists
them, tests/helm checks that the dashboards name nothing else."""
from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import httpx
import pytest

from baton.operators.autoscaler.signals import PROMQL
from tests.launcher import Stack

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "baton"
# The operator's own metrics come from `baton operator`, which is not part of a serving stack.
OPERATOR_PREFIX = "baton_autoscaler_"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)")
DECLARED = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ")
AUTH = {"Authorization": "Bearer sk-alpha"}


def listed_metrics() -> set[str]:
    lines = (CHART / "dashboards" / "metrics.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def promql_metrics() -> set[str]:
    return {name for query in PROMQL.values() for name in re.findall(r"\bbaton_[a-z0-9_]+", query)}


def metrics_url(line_source: list[str]) -> str:
    port = next(
        int(m.group(1)) for line in line_source if (m := re.search(r"metrics on :(\d+)", line)))
    return f"http://127.0.0.1:{port}/metrics"


def exported(url: str) -> set[str]:
    """Sample names (a histogram's _bucket/_sum/_count, a counter's _total) plus declared families:
    a labelled metric that nothing has incremented yet (a KV transfer failure) has no sample but is
    exported all the same."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    names = set()
    for line in text.splitlines():
        m = DECLARED.match(line) if line.startswith("#") else SAMPLE.match(line)
        if m:
            names.add(m.group(1))
    return names


def is_exported(name: str, samples: set[str]) -> bool:
    """A histogram is listed by its base name; any other metric by its sample name."""
    return name in samples or f"{name}_bucket" in samples


@pytest.fixture(scope="module")
def samples(disaggregated: Stack) -> set[str]:
    model = _served_model(disaggregated)
    for i in range(3):
        response = httpx.post(
            f"{disaggregated.url}/completions", timeout=60,
            headers=AUTH,
            json={"model": model, "prompt": f"dashboard check {i} " * 40, "max_tokens": 8})
        assert response.status_code == 200, response.text
    gateway = exported(disaggregated.metrics_url)
    urls = [metrics_url(disaggregated.router.output)]
    urls += [metrics_url(worker.output) for worker in disaggregated.workers()]
    return gateway.union(*(exported(url) for url in urls))


def _served_model(stack: Stack) -> str:
    models = httpx.get(f"{stack.url}/models", headers=AUTH, timeout=10).json()
    return models["data"][0]["id"]


def test_every_dashboard_metric_is_exported(samples: set[str]) -> None:
    missing = sorted(n for n in listed_metrics()
                     if not n.startswith(OPERATOR_PREFIX) and not is_exported(n, samples))
    assert not missing, f"dashboards/metrics.txt names metrics no process exports: {missing}"


def test_every_autoscaler_metric_is_exported(samples: set[str]) -> None:
    names = {n.removesuffix("_bucket") for n in promql_metrics()}
    missing = sorted(n for n in names if not is_exported(n, samples))
    assert not missing, f"the autoscaler's PromQL names metrics no process exports: {missing}"

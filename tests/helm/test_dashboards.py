"""The Grafana dashboards are well-formed and every PromQL expression (theirs and the autoscaler's)
names only metrics from dashboards/metrics.txt, the list a live /metrics scrape is to be checked
against."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from baton.operators.autoscaler import signals
from tests.helm.conftest import CHART, REPO

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC = re.compile(r"\bbaton_[a-z0-9_]+")


def known_metrics() -> set[str]:
    lines = (CHART / "dashboards" / "metrics.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def metric_names(expr: str) -> set[str]:
    names = set()
    for name in METRIC.findall(expr):
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in known_metrics():
                name = name.removesuffix(suffix)
        names.add(name)
    return names


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return exprs + [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]


def test_there_is_a_dashboard_per_concern() -> None:
    assert {p.stem for p in DASHBOARDS} == {"overview", "pools", "kv-transfer", "router"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_valid_grafana_json(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    for panel in dashboard["panels"]:
        assert panel["type"] and panel["title"] and {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert len(names) == len(set(names)) and "datasource" in names


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_promql_names_only_known_metrics(path: Path) -> None:
    for expr in expressions(json.loads(path.read_text())):
        names = metric_names(expr)
        assert names, f"no baton metric in {expr!r}"
        assert names <= known_metrics(), f"unknown metrics {names - known_metrics()} in {expr!r}"


def test_autoscaler_promql_names_only_known_metrics() -> None:
    for expr in signals.PROMQL.values():
        assert metric_names(expr) and metric_names(expr) <= known_metrics(), expr


def test_metric_check_catches_an_unknown_name() -> None:
    assert metric_names("rate(baton_made_up_total[1m])") - known_metrics() == {
        "baton_made_up_total"
    }
    assert metric_names("sum(rate(baton_time_to_first_token_seconds_bucket[1m]))") == \
        {"baton_time_to_first_token_seconds"}


def model_labelled_metrics() -> set[str]:
    """The metrics docs/metrics.md gives a `model_name` label: every engine metric, and the
    worker's that list it among their labels."""
    names, section = set(), ""
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        section = line if line.startswith("## ") else section
        row = re.match(r"\| `(baton_[a-z0-9_]+)` \|", line)
        if row and (section.startswith("## Engine") or "model_name" in line.split("|")[3]):
            names.add(row.group(1))
    return names


SELECTOR = re.compile(r"(baton_[a-z0-9_]+)\{([^}]*)\}")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_model_labelled_series_follow_the_model_selector(path: Path) -> None:
    """Several base models behind one gateway: each panel over a series carrying `model_name`
    shows the models the `model` variable selects, and the dashboard offers that variable."""
    dashboard = json.loads(path.read_text())
    labelled = model_labelled_metrics()
    assert {"baton_num_requests_running", "baton_time_to_first_token_seconds"} <= labelled
    selected = 0
    for expr in expressions(dashboard):
        for metric, selector in SELECTOR.findall(expr):
            if metric_names(metric) & labelled and "label_values" not in expr:
                assert 'model_name=~"$model"' in selector, f"{metric} in {path.name}: {expr}"
                selected += 1
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert ("model" in names) == (selected > 0), path.name

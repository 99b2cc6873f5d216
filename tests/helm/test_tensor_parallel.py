"""Tensor-parallel pools from the chart: the example BatonDeployments the chart renders for 8-GPU
and 4-GPU nodes, turned into workloads by the operator's own rendering, give a Deployment per pool
whose replicas fit a node and a LeaderWorkerSet per pool whose replicas span nodes; the operator's
RBAC covers LeaderWorkerSets unless switched off."""
from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from baton.operators import resources as r
from baton.operators.children import all_children
from baton.operators.placement import LWS_KIND
from baton.operators.pools import pool_objects
from baton.operators.settings import OperatorSettings
from baton.operators.spec import defaulted
from tests.helm.conftest import documents

KUBERNETES_VERSION = "1.35"
SETTINGS = OperatorSettings()
LWS_RULE = {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"]}


def workloads(rendered: str) -> dict[str, dict[str, Any]]:
    """Role -> the workload the operator makes for the chart's example BatonDeployment."""
    owner = next(d for d in documents(rendered) if d["kind"] == r.DEPLOYMENT_KIND)
    owner["metadata"]["uid"] = "uid"
    out = {}
    for child in all_children(owner, defaulted(r.DEPLOYMENT_KIND, owner), SETTINGS):
        if child["kind"] == r.POOL_KIND:
            child["metadata"]["uid"] = "pool-uid"
            pool = {**child, "spec": defaulted(r.POOL_KIND, child)}
            out[pool["spec"]["role"]] = pool_objects(pool, SETTINGS, monitors=False)[0]
    return out


def pod_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == LWS_KIND:
        template = workload["spec"]["leaderWorkerTemplate"]
        return [template["leaderTemplate"], template["workerTemplate"]]
    return [workload["spec"]["template"]]


def gpus(template: dict[str, Any]) -> int:
    return template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]


@pytest.mark.parametrize("name, kinds, pod_gpus", [
    ("tensor-parallel", {"prefill": "Deployment", "decode": "Deployment"},
     {"prefill": [4], "decode": [8]}),
    ("multinode", {"prefill": "Deployment", "decode": LWS_KIND},
     {"prefill": [4], "decode": [4, 4]}),
])
def test_each_pool_is_the_workload_its_placement_needs(rendered: dict[str, str], name: str,
                                                       kinds: dict[str, str],
                                                       pod_gpus: dict[str, list[int]]) -> None:
    made = workloads(rendered[name])
    assert {role: w["kind"] for role, w in made.items()} == kinds
    for role, workload in made.items():
        templates = pod_templates(workload)
        assert [gpus(t) for t in templates] == pod_gpus[role]
        for template in templates:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": template["spec"]}
            kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        if workload["kind"] == "Deployment":
            kubernetes_validate.validate(workload, KUBERNETES_VERSION, strict=True)


def operator_rules(rendered: str) -> list[dict[str, Any]]:
    roles = [d for d in documents(rendered) if d["kind"] in ("ClusterRole", "Role")]
    return [rule for role in roles for rule in role["rules"]]


def test_the_operator_may_manage_leaderworkersets(rendered: dict[str, str]) -> None:
    assert LWS_RULE in operator_rules(rendered["default"])
    assert LWS_RULE in operator_rules(rendered["multinode"])
    assert not any("leaderworkerset.x-k8s.io" in rule["apiGroups"]
                   for rule in operator_rules(rendered["namespaced"]))

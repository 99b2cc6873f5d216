"""Tensor-parallel pools through the running operator (kopf against kmock): a pool that spans nodes
becomes a LeaderWorkerSet, switching placement replaces the other kind, a cluster without the LWS
API gets a Degraded pool instead of a wrong Deployment, and the autoscaler counts whole groups."""
from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from prometheus_client import REGISTRY

from baton.operators import resources as r
from baton.operators.autoscaler.gpu_seconds import GpuSeconds
from baton.operators.autoscaler.loop import evaluate
from baton.operators.autoscaler.policy import Signals
from baton.operators.kube import KINDS
from baton.operators.placement import LWS_KIND, LWS_WORKER_INDEX
from baton.operators.spec import defaulted
from tests.operators.conftest import NAMESPACE, FakeSource, Operator
from tests.operators.test_operator import body, create, wait_for

pytestmark = pytest.mark.asyncio

SPEC: dict[str, Any] = {
    "model": {"pvc": {"claimName": "llama-70b"}},
    "image": {"worker": "baton/worker:1"},
    "pools": {
        "prefill": {"minReplicas": 1, "maxReplicas": 4, "tensorParallelSize": 4},
        "decode": {"minReplicas": 1, "maxReplicas": 4, "tensorParallelSize": 16,
                   "autoscaling": {"scaleUp": {"cooldownSeconds": 0}}},
    },
}


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


async def test_a_pool_spanning_nodes_is_a_leaderworkerset_and_switches_back(
        operator: Operator) -> None:
    await create(operator, body("llama", SPEC))
    lws = await wait_for(operator, LWS_KIND, "llama-decode")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    prefill = await wait_for(operator, "Deployment", "llama-prefill")
    assert prefill["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == 4
    assert await operator.kube.get("Deployment", NAMESPACE, "llama-decode") is None
    service = await wait_for(operator, "Service", "llama-decode")
    assert service["spec"]["selector"][LWS_WORKER_INDEX] == "0"
    pool = await wait_for(operator, r.POOL_KIND, "llama-decode",
                          lambda p: p.get("status", {}).get("workload"))
    assert pool["status"]["workload"] == LWS_KIND
    assert f"{LWS_WORKER_INDEX}=0" in pool["status"]["selector"].split(",")
    assert conditions(pool)["Degraded"]["status"] == "False"

    # Eight ranks fit one node: the same pool becomes a Deployment and the group goes.
    spec = copy.deepcopy(SPEC)
    spec["pools"]["decode"]["tensorParallelSize"] = 8
    await operator.kube.patch(r.DEPLOYMENT_KIND, NAMESPACE, "llama", {"spec": spec})
    await wait_for(operator, "Deployment", "llama-decode")
    for _ in range(100):
        if await operator.kube.get(LWS_KIND, NAMESPACE, "llama-decode") is None:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the LeaderWorkerSet survived the switch to one pod per replica")
    service = await wait_for(operator, "Service", "llama-decode",
                             lambda s: LWS_WORKER_INDEX not in s["spec"]["selector"])
    pool = await wait_for(operator, r.POOL_KIND, "llama-decode",
                          lambda p: p.get("status", {}).get("workload") == "Deployment")


async def test_without_the_lws_api_a_spanning_pool_is_degraded_not_rendered(
        operator_without_lws: Operator) -> None:
    op = operator_without_lws
    await create(op, body("llama", SPEC))
    pool = await wait_for(op, r.POOL_KIND, "llama-decode",
                          lambda p: "Degraded" in conditions(p))
    degraded = conditions(pool)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "LeaderWorkerSetMissing")
    assert "install the LWS controller" in degraded["message"]
    assert conditions(pool)["Ready"]["status"] == "False"
    # The pool within a node is made as usual; the spanning one is never made as something else.
    await wait_for(op, "Deployment", "llama-prefill")
    assert await op.kube.get("Deployment", NAMESPACE, "llama-decode") is None
    assert await op.kube.get("Service", NAMESPACE, "llama-decode") is None


async def test_a_placement_the_rules_refuse_is_reported_when_no_cel_ran(operator: Operator) -> None:
    spec = copy.deepcopy(SPEC)
    spec["pools"]["decode"]["tensorParallelSize"] = 12
    await create(operator, body("odd", spec))
    bad = await wait_for(operator, r.DEPLOYMENT_KIND, "odd",
                         lambda o: "Degraded" in conditions(o))
    assert "tensorParallelSize must be a power of two" in conditions(bad)["Degraded"]["message"]
    assert await operator.kube.get(r.POOL_KIND, NAMESPACE, "odd-decode") is None


async def test_the_autoscaler_adds_whole_groups(operator: Operator) -> None:
    operator.source.signals["llama-decode"] = Signals(kv_cache_usage=0.99)
    await create(operator, body("llama", SPEC))
    await wait_for(operator, LWS_KIND, "llama-decode")
    # What the LWS controller reports for one group of two ready pods.
    await operator.kube.patch(LWS_KIND, NAMESPACE, "llama-decode",
                              {"status": {"replicas": 1, "readyReplicas": 1}}, sub="status")
    pool = await wait_for(operator, r.POOL_KIND, "llama-decode",
                          lambda p: p["spec"]["replicas"] > 1 and p.get("status", {}).get("gpus"))
    assert pool["status"]["lastScaling"]["reason"] == "KVCachePressure"
    await wait_for(operator, LWS_KIND, "llama-decode",
                   lambda o: o["spec"]["replicas"] == pool["spec"]["replicas"])
    assert pool["status"]["gpus"] % 16 == 0 and pool["status"]["gpus"] >= 16
    owner = await wait_for(operator, r.DEPLOYMENT_KIND, "llama",
                           lambda o: o.get("status", {}).get("pools", {}).get("decode"))
    assert owner["status"]["pools"]["decode"]["gpus"] % 16 == 0


def gpu_seconds(pool: str) -> float:
    return REGISTRY.get_sample_value("baton_autoscaler_gpu_seconds_total", {"pool": pool}) or 0.0


async def test_gpu_seconds_count_every_gpu_of_a_replica(operator: Operator) -> None:
    """Goodput per GPU divides by GPU-seconds: a replica of 16 ranks holds 16 GPUs for as long as it
    runs, one of 4 ranks 4."""
    meter, states = GpuSeconds(), {}
    for name, ranks, kind, replicas in (("big-decode", 16, LWS_KIND, 2),
                                        ("small-decode", 4, "Deployment", 3)):
        pool = {"apiVersion": r.API_VERSION, "kind": r.POOL_KIND,
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"deployment": "m", "role": "decode", "replicas": replicas,
                         "model": {"pvc": {"claimName": "m"}}, "image": {"worker": "w"},
                         "tensorParallelSize": ranks, "autoscaling": {"mode": "manual"}}}
        pool["spec"] = defaulted(r.POOL_KIND, pool)
        # The workload as its controller reports it: `replicas` groups (or pods) running.
        await operator.kube.call("POST", KINDS[kind].path(NAMESPACE), {
            "kind": kind, "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}})
        before = gpu_seconds(name)
        for now in (1000.0, 1030.0):
            _, status = await evaluate(operator.kube, FakeSource(), pool, pool["spec"], states,
                                       lambda *_: None, meter, now=now)
        assert status["gpus"] == replicas * ranks
        assert gpu_seconds(name) - before == pytest.approx(30 * replicas * ranks)

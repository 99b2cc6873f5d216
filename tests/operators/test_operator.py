"""The operator end to end against kmock: children, scale, manual mode, finalizer cleanup,
idempotence."""
from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from baton.operators import resources as r
from baton.operators.autoscaler.policy import Signals
from baton.operators.sync import sync_children
from baton.operators.kube import KINDS
from baton.operators.settings import OperatorSettings
from baton.operators.spec import defaulted
from tests.operators.conftest import NAMESPACE, Operator, RecordingKube

pytestmark = pytest.mark.asyncio

SPEC = {
    "model": {"huggingFace": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "hf"}},
    "image": {"worker": "baton/worker:1"},
    "gateway": {"apiKeysSecretRef": {"name": "keys"}},
    "slos": [{"priority": 0, "ttftMillis": 800, "tpotMillis": 40},
             {"priority": -1, "ttftMillis": 5000, "tpotMillis": 200}],
    "pools": {
        "prefill": {"minReplicas": 1, "maxReplicas": 4, "gpus": 2, "kvTransport": "grpc"},
        "decode": {
            "minReplicas": 2, "maxReplicas": 6, "engineArgs": {"max-num-seqs": "64"},
            "autoscaling": {"scaleUp": {"cooldownSeconds": 0}}
        }
    },
}


def body(name: str = "qwen", spec: dict[str, Any] | None = None) -> dict[str, Any]:
    # kmock assigns neither uid nor resourceVersion; kopf needs both to patch finalizers away.
    return {
        "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND, "metadata": {
            "name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "resourceVersion": "1",
            "generation": 1
        }, "spec": copy.deepcopy(spec or SPEC)
    }


def flags(args: list[str], *names: str) -> list[str]:
    """The value after each named flag."""
    return [args[args.index(name) + 1] for name in names]


async def create(op: Operator, obj: dict[str, Any]) -> None:
    await op.kube.call("POST", KINDS[obj["kind"]].path(NAMESPACE), obj)


async def wait_for(op: Operator, kind: str, name: str, check: Any = bool) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for _ in range(200):
        last = await op.kube.get(kind, NAMESPACE, name) or {}
        if last and check(last):
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"{kind}/{name} never matched; last seen: {last}")


async def test_creating_a_deployment_makes_every_child(operator: Operator) -> None:
    await create(operator, body())
    worker = await wait_for(operator, "Deployment", "qwen-decode")
    owner_of = lambda o: o["metadata"]["ownerReferences"][0]  # noqa: E731
    for kind, name in [("ServiceAccount", "qwen-router"), ("Role", "qwen-router"),
                       ("RoleBinding", "qwen-router"), ("Deployment", "qwen-router"),
                       ("Service", "qwen-router"), ("Deployment", "qwen-gateway"),
                       ("Service", "qwen-gateway"), ("PodDisruptionBudget", "qwen-gateway"),
                       ("WorkerPool", "qwen-prefill"), ("WorkerPool", "qwen-decode")]:
        child = await wait_for(operator, kind, name)
        assert (owner_of(child)["kind"], owner_of(child)["uid"], owner_of(child)["controller"]) == \
            (r.DEPLOYMENT_KIND, "uid-qwen", True), f"{kind}/{name}"
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        child = await wait_for(operator, kind, "qwen-prefill")
        assert owner_of(child)["kind"] == r.POOL_KIND and owner_of(child)["name"] == "qwen-prefill"
    prefill = (await wait_for(operator, "Deployment", "qwen-prefill"))["spec"]
    container = prefill["template"]["spec"]["containers"][0]
    assert prefill["replicas"] == 1 and container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["args"][:3] == ["worker", "--role", "prefill"]
    assert flags(container["args"], "--kv-transport", "--served-model-name",
                 "--metrics-port") == ["grpc", "qwen", "9100"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                               "key": "token"}}} in container["env"]
    assert {"name": "BATON_WORKER_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert prefill["template"]["spec"]["initContainers"][0]["command"][3] == "Qwen/Qwen3-8B"
    decode = worker["spec"]
    assert decode["replicas"] == 2 and "--max-num-seqs" in decode["template"]["spec"]["containers"][
        0]["args"]
    router = (await wait_for(operator, "Deployment", "qwen-router"))["spec"]["template"]["spec"]
    assert router["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert router["serviceAccountName"] == "qwen-router" and router[
        "automountServiceAccountToken"] is True
    assert flags(router["containers"][0]["args"], "--model", "--kube-label-selector") == [
        "qwen", f"{r.LABEL_GATEWAY}=qwen,{r.LABEL_ROLE}"]
    gateway = (await wait_for(operator, "Deployment",
                              "qwen-gateway"))["spec"]["template"]["spec"]["containers"][0]
    assert flags(gateway["args"], "--router", "--served-model-name", "--slos") == [
        "qwen-router:8001", "qwen", "0=800/40,-1=5000/200"]
    assert "--api-keys-file=/etc/baton/keys/keys.yaml" in gateway["args"]
    decode_service = await wait_for(operator, "Service", "qwen-decode")
    assert decode_service["spec"]["clusterIP"] == "None"
    assert decode_service["metadata"]["labels"][r.LABEL_GATEWAY] == "qwen"
    assert [p["name"] for p in decode_service["spec"]["ports"]] == ["grpc", "http"]
    pool = await wait_for(operator, "WorkerPool", "qwen-decode")
    assert pool["spec"]["routerUrl"] == "http://qwen-router:9100"


async def test_a_gateway_state_volume_reaches_the_gateway_deployment(operator: Operator) -> None:
    spec = copy.deepcopy(SPEC)
    spec["gateway"]["stateStoreVolume"] = {"claimName": "qwen-state"}
    await create(operator, body("stateful", spec))
    gateway = (await wait_for(operator, "Deployment", "stateful-gateway"))["spec"]
    pod = gateway["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"]
                 if m["mountPath"] == "/var/lib/baton/state")
    assert {"name": mount["name"], "persistentVolumeClaim": {"claimName": "qwen-state"}} in \
        pod["volumes"]
    assert "--state-store=sqlite:////var/lib/baton/state/state.db" in pod["containers"][0]["args"]
    assert gateway["strategy"] == {"type": "Recreate"}


async def test_scale_subresource_reaches_the_deployment(operator: Operator) -> None:
    await create(operator, body())
    await wait_for(operator, "Deployment", "qwen-prefill")
    # What `kubectl scale workerpool/qwen-prefill --replicas=3` sends.
    await operator.kube.patch("WorkerPool", NAMESPACE, "qwen-prefill", {"spec": {"replicas": 3}},
                              sub="scale")
    await wait_for(operator, "Deployment", "qwen-prefill", lambda d: d["spec"]["replicas"] == 3)
    pool = await wait_for(operator, "WorkerPool", "qwen-prefill",
                          lambda p: p.get("status", {}).get("selector"))
    assert f"{r.LABEL_POOL}=qwen-prefill" in pool["status"]["selector"].split(",")


async def test_manual_pool_is_never_touched_by_the_autoscaler(operator: Operator) -> None:
    spec = copy.deepcopy(SPEC)
    spec["pools"]["prefill"]["autoscaling"] = {"mode": "manual"}
    for role in ("prefill", "decode"):
        operator.source.signals[f"qwen-{role}"] = Signals(queue_time_p95_s=5.0, kv_cache_usage=0.99)
    await create(operator, body(spec=spec))
    # The auto pool moves on the same pressure, which shows the autoscaler ran meanwhile.
    decode = await wait_for(
        operator, "WorkerPool", "qwen-decode",
        lambda p: p["spec"]["replicas"] > 2 and p.get("status", {}).get("lastScaling"))
    assert decode["status"]["lastScaling"]["reason"] == "KVCachePressure"
    prefill = await wait_for(operator, "WorkerPool", "qwen-prefill")
    assert prefill["spec"]["replicas"] == 1 and "lastDecision" not in prefill.get("status", {})
    assert not [
        w for w in operator.writes()
        if w[1].endswith("/workerpools/qwen-prefill") and w[0] == "PATCH" and "spec" in (w[2] or {})
    ]
    owner = await wait_for(operator, r.DEPLOYMENT_KIND, "qwen",
                           lambda o: o.get("status", {}).get("lastScaling"))
    assert owner["status"]["pools"]["prefill"]["mode"] == "manual"


async def test_delete_cleans_up_through_the_finalizer(operator: Operator) -> None:
    await create(operator, body())
    live = await wait_for(operator, r.DEPLOYMENT_KIND, "qwen",
                          lambda o: o["metadata"].get("finalizers"))
    assert live["metadata"]["finalizers"] == [f"{r.GROUP}/finalizer"]
    await wait_for(operator, "Deployment", "qwen-decode")
    await operator.kube.delete(r.DEPLOYMENT_KIND, NAMESPACE, "qwen")
    async def gone() -> bool:
        names = [("Deployment", n)
                 for n in ("qwen-router", "qwen-gateway", "qwen-prefill", "qwen-decode")]
        names += [("WorkerPool", "qwen-prefill"), ("ServiceAccount", "qwen-router"),
                  (r.DEPLOYMENT_KIND, "qwen")]
        return all([await operator.kube.get(kind, NAMESPACE, name) is None for kind, name in names])
    for _ in range(200):
        if await gone():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("children or the deployment survived the delete")


async def test_second_reconcile_changes_nothing(operator: Operator) -> None:
    await create(operator, body())
    live = await wait_for(operator, "Deployment", "qwen-gateway")
    owner = await operator.kube.get(r.DEPLOYMENT_KIND, NAMESPACE, "qwen")
    kube = RecordingKube(operator.kube.api)
    changes = await sync_children(kube, owner, defaulted(r.DEPLOYMENT_KIND, owner),
                                  OperatorSettings())
    assert changes == [] and kube.written == []
    assert (await operator.kube.get("Deployment", NAMESPACE, "qwen-gateway")) == live


async def test_invalid_spec_is_degraded_and_makes_nothing(operator: Operator) -> None:
    spec = copy.deepcopy(SPEC)
    spec["pools"]["decode"].update(minReplicas=5, maxReplicas=3)
    await create(operator, body("bad", spec))
    bad = await wait_for(operator, r.DEPLOYMENT_KIND, "bad",
                         lambda o: o.get("status", {}).get("conditions"))
    degraded = next(c for c in bad["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "minReplicas must not exceed maxReplicas" in degraded["message"]
    assert await operator.kube.get("Deployment", NAMESPACE, "bad-router") is None


async def test_gateway_replicas_without_a_shared_store_are_degraded(operator: Operator) -> None:
    spec = copy.deepcopy(SPEC)
    spec["gateway"] = {"replicas": 2}
    await create(operator, body("unshared", spec))
    bad = await wait_for(operator, r.DEPLOYMENT_KIND, "unshared",
                         lambda o: o.get("status", {}).get("conditions"))
    degraded = next(c for c in bad["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "needs a shared rate-limit store" in degraded["message"]
    assert "needs a shared state store" in degraded["message"]
    assert await operator.kube.get("Deployment", NAMESPACE, "unshared-gateway") is None

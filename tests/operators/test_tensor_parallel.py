"""Tensor-parallel pools as the operator renders them: ranks within a node in one Deployment pod,
ranks beyond a node as a LeaderWorkerSet group whose leader alone serves; the group's start-up
script run for real by `sh`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from baton.operators import resources as r
from baton.operators.children import worker_pool
from baton.operators.placement import LWS_API_VERSION, LWS_WORKER_INDEX
from baton.operators.pools import endpoint_selector, pool_objects, selector_string
from baton.operators.settings import OperatorSettings
from baton.operators.spec import defaulted

Obj = dict[str, Any]
KUBERNETES_VERSION = "1.35"
SETTINGS = OperatorSettings()
# The fields of leaderworkerset.x-k8s.io/v1 (kubernetes-sigs/lws, api/leaderworkerset/v1): the API
# server prunes any other, so a misspelt one would be silently lost.
LWS_SPEC_FIELDS = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy",
                   "networkConfig"}
LWS_TEMPLATE_FIELDS = {"leaderTemplate", "workerTemplate", "size", "restartPolicy",
                       "subGroupPolicy", "volumeClaimTemplates",
                       "persistentVolumeClaimRetentionPolicy"}


def pool(role: str = "decode", **fields: Any) -> Obj:
    """The WorkerPool the operator makes for `role` of a BatonDeployment, defaulted as the API
    server stores it."""
    spec = {"model": {"pvc": {"claimName": "llama-70b"}}, "image": {"worker": "baton/worker:1"},
            "pools": {"prefill": {}, "decode": {}}}
    spec["pools"][role] = {"minReplicas": 2, "maxReplicas": 4, **fields}
    owner = {"apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
             "metadata": {"name": "llama", "namespace": "llm", "uid": "u"}}
    body = worker_pool(owner, defaulted(r.DEPLOYMENT_KIND, {"spec": spec}), role, SETTINGS)
    body["metadata"]["uid"] = "pool-uid"  # the API server's, on creation
    return {**body, "spec": defaulted(r.POOL_KIND, body)}


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def validate_pod(template: Obj) -> None:
    """A pod template is valid Kubernetes: checked as the Pod it becomes."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]},
           "spec": template["spec"]}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_ranks_within_a_node_run_in_one_deployment_pod() -> None:
    body = pool(tensorParallelSize=4)
    deployment, service, budget = pool_objects(body, SETTINGS, monitors=False)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 2
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    assert box["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert flag(box["args"], "--tensor-parallel-size") == "4"
    assert "--distributed-executor-backend" not in box["args"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in box["volumeMounts"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for doc in (deployment, service, budget):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_pool_without_tensor_parallelism_keeps_its_flags_and_gpus() -> None:
    deployment = pool_objects(pool(gpus=2), SETTINGS, monitors=False)[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "--tensor-parallel-size" not in container["args"]
    assert all(m["name"] != "dshm" for m in container["volumeMounts"])


def test_every_worker_may_load_its_model_before_liveness_counts() -> None:
    box = pool_objects(pool(), SETTINGS, monitors=False)[0]["spec"]["template"]["spec"][
        "containers"][0]
    startup = box["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= \
        SETTINGS.worker_startup_timeout_seconds


def lws_parts(body: Obj) -> tuple[Obj, Obj, Obj]:
    """(the LeaderWorkerSet, its leader's container, a rank pod's container)."""
    lws = pool_objects(body, SETTINGS, monitors=False)[0]
    template = lws["spec"]["leaderWorkerTemplate"]
    return (lws, template["leaderTemplate"]["spec"]["containers"][0],
            template["workerTemplate"]["spec"]["containers"][0])


def test_ranks_beyond_a_node_run_as_a_leaderworkerset_group_of_whole_nodes() -> None:
    lws, leader, rank = lws_parts(pool(tensorParallelSize=16))
    assert (lws["apiVersion"], lws["kind"]) == (LWS_API_VERSION, "LeaderWorkerSet")
    assert set(lws["spec"]) <= LWS_SPEC_FIELDS
    template = lws["spec"]["leaderWorkerTemplate"]
    assert set(template) <= LWS_TEMPLATE_FIELDS
    assert (lws["spec"]["replicas"], template["size"]) == (2, 2)  # replicas are groups
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert rank["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert flag(leader["args"], "--tensor-parallel-size") == "16"
    assert flag(leader["args"], "--distributed-executor-backend") == "ray"
    assert leader["command"][:2] == ["sh", "-c"] and leader["command"][3:5] == ["leader", "6379"]
    assert leader["command"][5] == "16"  # GPUs the Ray cluster must have before the worker starts
    assert rank["command"] == ["ray", "start", "--address=$(LWS_LEADER_ADDRESS):6379", "--block",
                               "--disable-usage-stats"]
    # Only the leader is probed and has ports: the group's readiness is the leader's.
    assert {"readinessProbe", "livenessProbe", "startupProbe"} <= set(leader)
    assert not {"readinessProbe", "livenessProbe", "startupProbe", "ports"} & set(rank)
    # Every rank loads its shard of the same checkpoint, from the same path.
    assert [m for m in rank["volumeMounts"] if m["name"] == "model"] == \
        [m for m in leader["volumeMounts"] if m["name"] == "model"]
    validate_pod(template["leaderTemplate"])
    validate_pod(template["workerTemplate"])


def test_a_ranks_pod_outlives_its_leaders_drain() -> None:
    body = pool(tensorParallelSize=16)
    lws, leader, rank = lws_parts(body)
    wait = int(rank["lifecycle"]["preStop"]["exec"]["command"][1])
    assert wait > body["spec"]["drainTimeoutSeconds"]
    grace = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace > wait


def test_nodes_of_four_gpus_make_groups_of_two_for_eight_ranks() -> None:
    lws, leader, _ = lws_parts(pool(tensorParallelSize=8, gpusPerNode=4))
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 4


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_only_the_leaders_are_router_endpoints() -> None:
    """The router finds workers through the pool Service's EndpointSlices: its selector must take
    the leaders (worker index 0, which the LWS controller labels them with) and no other pod of a
    group, whose ranks serve no Baton port."""
    body = pool(tensorParallelSize=16)
    lws, service = pool_objects(body, SETTINGS, monitors=False)[:2]
    labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert matches(selector, {**labels, LWS_WORKER_INDEX: "0"})
    assert not any(matches(selector, {**labels, LWS_WORKER_INDEX: str(i)}) for i in (1, 2, 3))
    # The scale subresource's selector counts one pod per replica, as an HPA expects.
    assert f"{LWS_WORKER_INDEX}=0" in selector_string(body).split(",")
    assert LWS_WORKER_INDEX not in endpoint_selector(pool(tensorParallelSize=8))


@pytest.fixture
def stand_ins(tmp_path: Path) -> dict[str, str]:
    """`ray` and `baton` executables and a `ray` Python module that log what they are asked, in
    order; the module's cluster has 8 GPUs at the first look and 16 from the second on."""
    log, bin_dir, lib = tmp_path / "calls.log", tmp_path / "bin", tmp_path / "lib" / "ray"
    bin_dir.mkdir()
    lib.mkdir(parents=True)
    for name in ("ray", "baton"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n'
                          f'[ -z "$FAIL_{name.upper()}" ] || exit 3\n')
        script.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (lib / "__init__.py").write_text(
        "import os\nlooks = 0\n\n\ndef _log(line):\n"
        "    with open(os.environ['CALLS'], 'a') as f:\n        f.write(line + '\\n')\n\n\n"
        "def init(**kwargs):\n    _log(f\"ray.init {kwargs['address']}\")\n\n\n"
        "def cluster_resources():\n    global looks\n    looks += 1\n"
        "    gpus = 8.0 if looks == 1 else 16.0\n    _log(f'cluster_resources {gpus:.0f}')\n"
        "    return {'GPU': gpus}\n")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(lib.parent),
            "CALLS": str(log)}


def run_leader(env: dict[str, str], **extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                           list[str]]:
    _, leader, _ = lws_parts(pool(tensorParallelSize=16))
    done = subprocess.run(leader["command"] + leader["args"], env={**env, **extra},
                          capture_output=True, text=True, timeout=60, check=False)
    calls = Path(env["CALLS"]).read_text().splitlines() if Path(env["CALLS"]).exists() else []
    return done, calls


def test_the_leader_starts_ray_waits_for_every_rank_then_runs_the_worker(
        stand_ins: dict[str, str]) -> None:
    done, calls = run_leader(stand_ins)
    assert done.returncode == 0, done.stderr
    _, leader, _ = lws_parts(pool(tensorParallelSize=16))
    assert calls == [
        "ray start --head --port=6379 --include-dashboard=false --disable-usage-stats",
        "ray.init auto", "cluster_resources 8", "cluster_resources 16",
        "baton " + " ".join(leader["args"])]
    assert "waiting for the group's GPUs to join Ray: 8 of 16" in done.stdout


def test_a_leader_whose_ray_head_fails_never_starts_the_worker(stand_ins: dict[str, str]) -> None:
    done, calls = run_leader(stand_ins, FAIL_RAY="1")
    assert done.returncode != 0
    assert [c.split()[0] for c in calls] == ["ray"]

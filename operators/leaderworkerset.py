"""A pool whose replicas span nodes runs as a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): each
replica is a group of tensorParallelSize/gpusPerNode pods, one per node. The leader (rank 0's node)
starts the Ray head, waits until every rank's GPU has joined, then runs `baton worker`, the only
process of the group the router talks to; the other pods only join the Ray cluster and host the
engine's ranks on their GPUs.

The LeaderWorkerSet controller names leaders `<pool>-<group>` and the other pods
`<pool>-<group>-<index>`, labels the leaders with worker index 0 (operators/pools.py routes to them
alone), gives every container LWS_LEADER_ADDRESS, and scales by whole groups, the highest first.
"""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators.model_source import ModelMount
from baton.operators.placement import LWS_API_VERSION, LWS_KIND, pods_per_replica, tensor_parallel
from baton.operators.settings import OperatorSettings
from baton.operators.workers import (PRE_STOP_SLEEP_S, pod_resources, pool_labels, shm_mounts,
                                     worker_container, worker_pod)

Obj = dict[str, Any]

# $1 port, $2 GPUs the Ray cluster must have, $3 the wait below, then `baton worker` and its flags.
LEADER_SCRIPT = """set -e
port=$1 ranks=$2 wait=$3
shift 3
ray start --head --port="$port" --include-dashboard=false --disable-usage-stats
python -c "$wait" "$ranks"
exec baton "$@"
"""
# Ray's logs live under /tmp, an emptyDir of 1 GiB: rotated small (by default each file grows to
# 512 MiB, times five backups) so that a long-running group is never evicted for its logs.
RAY_ENV = [{"name": "RAY_ROTATION_MAX_BYTES", "value": str(8 << 20)},
           {"name": "RAY_ROTATION_BACKUP_COUNT", "value": "1"}]
# The engine places one rank per GPU of the Ray cluster: it may start only once all have joined.
WAIT_FOR_RANKS = """import sys, time, ray
ray.init(address="auto", logging_level="ERROR")
want, seen = float(sys.argv[1]), None
while (have := ray.cluster_resources().get("GPU", 0)) < want:
    if have != seen:
        print(f"waiting for the group's GPUs to join Ray: {have:.0f} of {want:.0f}", flush=True)
        seen = have
    time.sleep(2)
"""


def leader_container(body: Obj, settings: OperatorSettings) -> tuple[Obj, ModelMount]:
    """The Baton worker of the group, behind a start-up that brings up the Ray head first; its
    flags stay in `args`, as on a single-pod worker."""
    box, source = worker_container(body, settings)
    box["command"] = ["sh", "-c", LEADER_SCRIPT, "leader", str(settings.ray_port),
                      str(tensor_parallel(body["spec"])), WAIT_FOR_RANKS]
    box["env"] = [*box["env"], *RAY_ENV]
    return box, source


def rank_container(body: Obj, settings: OperatorSettings, source: ModelMount) -> Obj:
    """A Ray worker on one node of the group: no Baton port, no probes (the leader's readiness is
    the group's), the model mounted where the leader's ranks expect it."""
    spec = body["spec"]
    return {
        "name": "ray-worker",
        "image": spec["image"]["worker"],
        "imagePullPolicy": spec["image"]["pullPolicy"],
        "command": ["ray", "start", f"--address=$(LWS_LEADER_ADDRESS):{settings.ray_port}",
                    "--block", "--disable-usage-stats"],
        "resources": pod_resources(spec),
        "securityContext": podspec.RESTRICTED_CONTAINER,
        "env": [*source.env, *RAY_ENV],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *source.mounts, *shm_mounts(spec)],
        # The group's ranks must outlive the leader's drain: its in-flight requests still run
        # collectives on every node until it exits.
        "lifecycle": {"preStop": {"exec": {"command": [
            "sleep", str(spec["drainTimeoutSeconds"] + PRE_STOP_SLEEP_S)]}}},
    }


def leader_worker_set(body: Obj, settings: OperatorSettings) -> Obj:
    spec = body["spec"]
    labels, _ = pool_labels(body)
    leader, source = leader_container(body, settings)
    rank = rank_container(body, settings, source)
    return {
        "apiVersion": LWS_API_VERSION, "kind": LWS_KIND,
        "metadata": podspec.metadata(body, body["metadata"]["name"], labels),
        "spec": {
            "replicas": spec["replicas"],
            "startupPolicy": "LeaderCreated",
            # A headless Service per group (named after its leader) that publishes pods before
            # they are ready: the ranks must resolve LWS_LEADER_ADDRESS while the leader still
            # waits for them. A shared one would be named after the pool, as its own Service is.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            # As for a Deployment: a new group comes up before an old one goes.
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxSurge": 1, "maxUnavailable": 0}},
            "leaderWorkerTemplate": {
                "size": pods_per_replica(spec),
                # A rank that died leaves its group unable to run a collective: restart them all.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": podspec.pod_template(worker_pod(body, leader, source), labels),
                "workerTemplate": podspec.pod_template(worker_pod(body, rank, source), labels),
            },
        },
    }

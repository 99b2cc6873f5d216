"""Where a replica of a tensor-parallel pool runs: one pod while its ranks fit one node, else a
LeaderWorkerSet group of whole nodes. Every answer comes from the (defaulted) pool spec: how many
GPUs a node has is declared (`gpusPerNode`), never guessed."""
from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
# Labels the LeaderWorkerSet controller puts on every pod of a group; the leader's worker index is
# "0".
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKLOAD_KINDS = ("Deployment", LWS_KIND)


def tensor_parallel(spec: Obj) -> int:
    return int(spec.get("tensorParallelSize", 1))


def spans_nodes(spec: Obj) -> bool:
    """A replica whose ranks outnumber one node's GPUs runs as a group of pods, one per node."""
    return tensor_parallel(spec) > int(spec.get("gpusPerNode", 8))


def workload_kind(spec: Obj) -> str:
    return LWS_KIND if spans_nodes(spec) else "Deployment"


def other_workload_kind(spec: Obj) -> str:
    """The kind a pool that switched placement may still have live, to be deleted."""
    return next(k for k in WORKLOAD_KINDS if k != workload_kind(spec))


def pods_per_replica(spec: Obj) -> int:
    """Pods in one replica: the leader (rank 0's node) plus one pod per further node."""
    return tensor_parallel(spec) // int(spec["gpusPerNode"]) if spans_nodes(spec) else 1


def gpus_per_pod(spec: Obj) -> int:
    """nvidia.com/gpu of each pod: a whole node in a group; one per rank in a single pod; `gpus`
    for a pool without tensor parallelism (0 runs on CPU)."""
    if spans_nodes(spec):
        return int(spec["gpusPerNode"])
    return tensor_parallel(spec) if tensor_parallel(spec) > 1 else int(spec.get("gpus", 1))


def gpus_per_replica(spec: Obj) -> int:
    """GPUs one replica holds, what the autoscaler counts per replica it adds or removes."""
    return gpus_per_pod(spec) * pods_per_replica(spec)


def pool_layouts(pools: Obj) -> Obj:
    """The pools with head-major KV blocks (engineArgs kv-cache-layout HND) on both sides when the
    prefill and decode pools' tensor-parallel sizes differ and neither names a layout: each decode
    rank then reads a prefill block's heads as one piece, not one per token (docs/sizing.md)."""
    if "prefill" not in pools or "decode" not in pools:
        return pools
    sides = ("prefill", "decode")
    if tensor_parallel(pools["prefill"]) == tensor_parallel(pools["decode"]) or any(
            "kv-cache-layout" in pools[role].get("engineArgs", {}) for role in sides):
        return pools
    return {role: {**pool, "engineArgs": {**pool.get("engineArgs", {}), "kv-cache-layout": "HND"}}
            if role in sides else pool for role, pool in pools.items()}

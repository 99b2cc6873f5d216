"""The BatonDeployment and WorkerPool CRDs, built here once: the chart's crds/ files are this
module's output.

`python -m baton.operators.crd_schema DIR` writes them; a test fails when the files and this module
disagree. The operator also reads these schemas at run time to default specs and to evaluate the CEL
rules itself.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from baton.operators import resources as r
from baton.operators.gateway_schema import gateway
from baton.operators.schema_builders import (RESOURCES, Schema, integer, obj, rule,
                                             service_component, string)

TOLERATION = obj({
    "key": string("Taint key the toleration applies to"),
    "operator": string("How key and value match", enum=["Exists", "Equal"]),
    "value": string("Taint value (with operator Equal)"),
    "effect": string("Taint effect; empty matches all",
                     enum=["", "NoSchedule", "PreferNoSchedule", "NoExecute"]),
    "tolerationSeconds": integer("How long a NoExecute taint is tolerated", minimum=0),
})
NODE_SELECTOR = {"type": "object", "additionalProperties": {"type": "string"},
                 "description": "Node labels the replicas must be scheduled on"}

# Flags the operator sets on each worker itself; engineArgs may not override them.
OWNED_ENGINE_FLAGS = ("model", "port", "role", "served-model-name", "host", "metrics-port",
                      "kv-transport", "drain-grace-seconds", "advertise-host", "worker-id",
                      "tensor-parallel-size", "distributed-executor-backend")
TENSOR_PARALLEL_SIZES = [1, 2, 4, 8, 16, 32, 64]


def scale_direction(up: bool) -> Schema:
    what = "up" if up else "down"
    return obj(
        {
            "stabilizationSeconds": integer(
                f"Scale {what} only to the {'lowest' if up else 'highest'} recommendation of this "
                "window",
                minimum=0, maximum=3600, default=0 if up else 300),
            "maxStep": integer(f"Most replicas added or removed by one scale-{what}", minimum=1,
                               maximum=100, default=2 if up else 1),
            "cooldownSeconds": integer(
                f"No scale-{what} sooner than this after the previous scaling", minimum=0,
                maximum=3600, default=30 if up else 120),
        }, default={})


def autoscaling() -> Schema:
    percent = {"minimum": 1, "maximum": 100}
    return obj(
        {
            "mode": string(
                "auto: the operator's autoscaler sets replicas; manual: only people (kubectl "
                "scale, HPA) do",
                enum=["auto", "manual"], default="auto"),
            "queueTimeBudgetPercent": integer(
                "Share of the tightest TTFT target that prefill queue time may use", default=50, **
                percent),
            "tokenUtilizationPercent": integer(
                "Target prefill-token demand as a share of measured capacity", default=80, **
                percent),
            "kvCacheHighPercent": integer("Decode KV-cache usage above which the pool scales up",
                                          default=85, **percent),
            "kvCacheLowPercent": integer(
                "Decode KV-cache usage below which the pool may scale down", default=40, **percent),
            "tpotAttainmentPercent": integer("Share of requests that must meet their TPOT target",
                                             default=95, **percent),
            "minGoodputGainPercent": integer(
                "A scale-up must have raised goodput by this much before the next one", default=5,
                minimum=0, maximum=100),
            "goodputGuardSeconds": integer(
                "How long a scale-up that bought no goodput blocks further scale-ups", default=600,
                minimum=0, maximum=86400),
            "scaleToZero": {
                "type": "boolean", "default": False,
                "description": "Allow 0 replicas after idleSecondsBeforeZero (the router "
                               "queues meanwhile)"
            },
            "idleSecondsBeforeZero": integer("Seconds without traffic before scaling to zero",
                                             default=900, minimum=60, maximum=86400),
            "scaleUp": scale_direction(up=True),
            "scaleDown": scale_direction(up=False),
        }, default={}, **{
            "x-kubernetes-validations": [
                rule("self.kvCacheLowPercent < self.kvCacheHighPercent",
                     "kvCacheLowPercent must be below kvCacheHighPercent")
            ]
        })


def worker_fields() -> dict[str, Schema]:
    """What shapes one worker replica; shared by a BatonDeployment's pools and a WorkerPool's
    spec."""
    return {
        "resources": RESOURCES,
        "gpus": integer(
            "GPUs per replica (nvidia.com/gpu); 0 runs on CPU. With tensorParallelSize above 1 a "
            "replica takes one GPU per rank", minimum=0, maximum=16, default=1),
        "tensorParallelSize": integer(
            "Ranks (GPUs) one replica shards the model over (`baton worker "
            "--tensor-parallel-size`): up to gpusPerNode in one pod, above it a LeaderWorkerSet "
            "group of tensorParallelSize/gpusPerNode pods, one per node, joined by Ray",
            minimum=1, maximum=64, default=1, **{"x-kubernetes-validations": [
                rule(f"self in {TENSOR_PARALLEL_SIZES}",
                     "tensorParallelSize must be a power of two (1, 2, 4, ... 64)")]}),
        "gpusPerNode": integer(
            "GPUs of each node the pool's pods run on (see nodeSelector); decides whether a "
            "replica fits one pod", minimum=1, maximum=16, default=8),
        "kvTransport": string(
            "How decode workers pull KV blocks from prefill workers: nixl (UCX, RDMA where "
            "available) or grpc (block bytes over the workers' gRPC port)", enum=["nixl", "grpc"],
            default="nixl"),
        "nodeSelector": NODE_SELECTOR,
        "tolerations": {"type": "array", "items": TOLERATION, "maxItems": 32},
        "engineArgs": {
            "type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 64,
            "description": "Extra engine flags, name without dashes -> value; \"true\" and "
                           "\"false\" turn a switch on or off (--enable-lora, --no-enable-lora)",
            "x-kubernetes-validations": [
                rule("self.all(k, k.matches('^[a-z][a-z0-9-]*$'))",
                     "engineArgs keys must be kebab-case flag names without leading dashes"),
                rule(
                    f"!self.exists(k, k in {list(OWNED_ENGINE_FLAGS)})",
                    "engineArgs must not set flags the operator owns: " +
                    ", ".join(OWNED_ENGINE_FLAGS))
            ]
        },
    }


POOL_RULES = [
    rule("self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas"),
    rule("self.minReplicas > 0 || self.autoscaling.scaleToZero",
         "minReplicas may be 0 only with autoscaling.scaleToZero"),
    # A group is whole nodes: its ranks split evenly over pods of gpusPerNode GPUs each.
    rule("self.tensorParallelSize <= self.gpusPerNode || "
         "self.tensorParallelSize % self.gpusPerNode == 0",
         "a tensorParallelSize above gpusPerNode must be a multiple of it (one whole node per "
         "pod)"),
    rule("self.tensorParallelSize == 1 || self.gpus == 1 || self.gpus == self.tensorParallelSize",
         "with tensorParallelSize above 1 each rank takes one GPU: leave gpus at 1 or set it to "
         "tensorParallelSize"),
]


def bounds() -> dict[str, Schema]:
    return {"minReplicas": integer("Fewest replicas", minimum=0, maximum=1000, default=1),
            "maxReplicas": integer("Most replicas", minimum=1, maximum=1000, default=4)}


def pool() -> Schema:
    return obj(
        {
            "replicas": integer(
                "Replicas when the pool is first made; later the autoscaler or kubectl "
                "scale decide",
                minimum=0, maximum=1000),
            **bounds(),
            **worker_fields(),
            "autoscaling": autoscaling(),
        }, **{
            "x-kubernetes-validations": POOL_RULES + [
                rule(
                    "!has(self.replicas) || (self.replicas >= self.minReplicas && self.replicas <= "
                    "self.maxReplicas)",
                    "replicas must lie within minReplicas..maxReplicas")
            ]
        })


def model() -> Schema:
    return obj(
        {
            "huggingFace": string("Hugging Face model id, e.g. Qwen/Qwen3-8B",
                                  pattern=r"^[\w.-]+(/[\w.-]+)?$", maxLength=200),
            "revision": string("Hugging Face revision (branch, tag or commit)", maxLength=100),
            "pvc": obj(
                {
                    "claimName": string("PersistentVolumeClaim holding the checkpoint",
                                        minLength=1), "path": string(
                                            "Checkpoint folder inside the claim", default="/")
                }, required=["claimName"]),
            "servedModelName": string(
                "Name clients use in requests; defaults to the deployment's name", maxLength=200),
            "tokenSecretRef": obj(
                {
                    "name": string("Secret name", minLength=1), "key": string(
                        "Key in the Secret", default="token")
                }, required=["name"],
                description="Secret with a Hugging Face token, set as HF_TOKEN"),
        }, oneOf=[{"required": ["huggingFace"]}, {"required": ["pvc"]}],
        description="Where the weights come from: exactly one of huggingFace (downloaded by an "
                    "init container) or pvc")


def images() -> Schema:
    image = {"type": "string", "minLength": 1, "pattern": r"^\S+$"}
    return obj(
        {
            "worker": {**image, "description": "Worker image (engine + KV transfer)"},
            "router":
                {**image, "description": "Router image; defaults to the operator's --router-image"},
            "gateway": {
                **image, "description": "Gateway image; defaults to the operator's --gateway-image"
            },
            "pullPolicy": string("Image pull policy", enum=["Always", "IfNotPresent", "Never"],
                                 default="IfNotPresent"),
        }, required=["worker"])


# The SLOs of a deployment that names none (a BatonDeployment's are defaulted by the operator, as a
# member behind another's gateway must leave them unset).
DEFAULT_SLOS = [{"priority": 0, "ttftMillis": 2000, "tpotMillis": 100}]


def slos(defaulted: bool = True) -> Schema:
    default = {"default": DEFAULT_SLOS} if defaulted else {}
    return {
        "type": "array", "maxItems": 16, "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["priority"],
        "description": "Latency targets per request priority" + (
            "" if defaulted else " (default: priority 0 with ttftMillis 2000 and tpotMillis 100; "
                                 "a member, see gatewayRef, takes its primary's)"),
        **default, "items": obj(
            {
                "priority": integer(
                    "Request priority (the gateway's `priority` field; higher is more "
                    "urgent); a priority without a target uses the nearest lower one's",
                    minimum=-1000, maximum=1000), "ttftMillis": integer(
                        "Time-to-first-token target", minimum=1, maximum=600000),
                "tpotMillis": integer("Time-per-output-token target", minimum=1, maximum=60000)
            }, required=["priority", "ttftMillis", "tpotMillis"])
    }


CONDITIONS: Schema = {
    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
    "items": obj(
        {
            "type": string("Ready, Progressing or Degraded"), "status": string(
                "True, False or Unknown", enum=["True", "False", "Unknown"]), "reason":
                    string("CamelCase cause"), "message": string("Details"), "observedGeneration": {
                        "type": "integer"
                    }, "lastTransitionTime": string("When status last changed", format="date-time")
        }, required=["type", "status"])
}
SCALING: Schema = obj({
    "from": {"type": "integer"}, "to": {"type": "integer"},
    "direction": string("up, down or hold",
                        enum=["up", "down", "hold"]), "reason": string("Why, as a CamelCase word"),
    "message": string("The numbers behind the reason"),
    "time": string("When the decision was taken",
                   format="date-time"), "pool": string("Which pool (on a BatonDeployment)")
})


def router() -> Schema:
    return service_component(
        "router", 8001, "gRPC", policy=string(
            "How requests are placed on workers: prefix-aware scores cached prefixes and load; "
            "least-loaded only load", enum=["prefix-aware", "least-loaded"],
            default="prefix-aware"),
        drainTimeoutSeconds=integer(
            "How long a worker may take to finish in-flight work before it stops", minimum=5,
            maximum=3600, default=120))


def gateway_ref() -> Schema:
    return obj(
        {"name": string("The BatonDeployment (same namespace, itself without gatewayRef) whose "
                        "gateway and router serve this one's model", minLength=1, maxLength=200,
                        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")},
        required=["name"],
        description="Serve this model behind another BatonDeployment's gateway and router: only "
                    "this one's worker pools are made, the router routes its model to them and "
                    "the gateway lists it. gateway, router and slos are that deployment's")


# A member's gateway, router and SLOs are its primary's, so none may be set on it. The three have
# no schema default for this reason (a default would make `has()` always true); the operator
# defaults them for a deployment without gatewayRef (spec.defaulted).
MEMBER_RULE = rule(
    "!has(self.gatewayRef) || (!has(self.gateway) && !has(self.router) && !has(self.slos))",
    "a BatonDeployment with gatewayRef runs behind that deployment's gateway and router: set "
    "gateway, router and slos there, not here")
UNDEFAULTED = ("gateway", "router", "slos")


def deployment_spec() -> Schema:
    fields = {
        "model": model(),
        "image": images(),
        "gatewayRef": gateway_ref(),
        "gateway": gateway(),
        "router": router(),
        "slos": slos(defaulted=False),
        "pools": obj(
            {role: pool() for role in r.ROLES},
            anyOf=[{"required": ["mixed"]}, {"required": ["prefill", "decode"]}],
            description="Either a mixed pool, or prefill and decode pools (and optionally mixed)"),
        "monitoring": obj(
            {
                "serviceMonitor": {
                    "type": "boolean", "default": True,
                    "description": "Make ServiceMonitors when the Prometheus Operator's CRDs "
                                   "exist"
                }
            }, default={}),
    }
    for name in UNDEFAULTED:
        fields[name] = {k: v for k, v in fields[name].items() if k != "default"}
    return obj(fields, required=["model", "image", "pools"],
               **{"x-kubernetes-validations": [MEMBER_RULE]})


def deployment_status() -> Schema:
    pool_status = obj({"replicas": {"type": "integer"}, "readyReplicas": {"type": "integer"},
                       "desiredReplicas": {"type": "integer"}, "mode": {"type": "string"},
                       "gpus": {"type": "integer"}})
    return obj({"observedGeneration": {"type": "integer"}, "conditions": CONDITIONS,
                "pools": {"type": "object", "additionalProperties": pool_status},
                "lastScaling": SCALING})


def pool_spec() -> Schema:
    return obj(
        {
            "deployment": string("The BatonDeployment this pool belongs to", minLength=1),
            "role": string("What the pool's workers do", enum=list(r.ROLES)),
            "replicas": integer(
                "Desired replicas: the scale subresource, the autoscaler or kubectl scale set it",
                minimum=0, maximum=1000),
            **bounds(),
            **worker_fields(),
            "autoscaling": autoscaling(),
            # Copied from the owning BatonDeployment, so that a pool reconciles on its own.
            "model": model(),
            "image": images(),
            "slos": slos(),
            "drainTimeoutSeconds": integer("How long a worker may take to finish in-flight work",
                                           minimum=5, maximum=3600, default=120),
            "routerUrl": string("The router this pool's workers are drained through",
                                pattern=r"^https?://.+"),
            "gateway": string(
                "The BatonDeployment whose router places work on this pool (its own, or its "
                "gatewayRef's); its Service carries it as the serving.baton.dev/gateway label the "
                "router selects workers by; unset: deployment", minLength=1),
            "serviceMonitor": {
                "type": "boolean", "default": True,
                "description": "Make a ServiceMonitor if possible"
            },
        },
        required=["deployment", "role", "replicas", "model", "image"],
        **{"x-kubernetes-validations": POOL_RULES})


def pool_status() -> Schema:
    return obj({
        "replicas": {"type": "integer"}, "readyReplicas": {"type": "integer"},
        "pendingReplicas": {"type": "integer"}, "desiredReplicas": {"type": "integer"},
        "selector": string("Label selector of the pool's pods, for the scale subresource"),
        "observedGeneration": {"type": "integer"}, "conditions": CONDITIONS, "lastScaling": SCALING,
        "lastDecision": SCALING,
        "gpus": integer("GPUs the pool's replicas hold (replicas x GPUs per replica)"),
        "workload": string("What runs the replicas: Deployment or LeaderWorkerSet"),
    })


def column(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def crd(kind: str, plural: str, short: str, spec: Schema, status: Schema,
        columns: list[dict[str, Any]], scale: bool) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector"
        }
    root = obj(
        {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"}, "spec": spec, "status": status
        }, required=["spec"])
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{r.GROUP}", "labels": {r.LABEL_PART_OF: "baton"}},
        "spec": {
            "group": r.GROUP, "scope": "Namespaced", "names": {
                "kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                "shortNames": [short], "categories": ["baton"]
            }, "versions": [{
                "name": r.VERSION, "served": True, "storage": True, "subresources": subresources,
                "additionalPrinterColumns": columns +
                                            [column("Age", ".metadata.creationTimestamp", "date")],
                "schema": {"openAPIV3Schema": root}
            }]
        },
    }


def deployment_crd() -> dict[str, Any]:
    return crd(r.DEPLOYMENT_KIND, r.DEPLOYMENT_PLURAL, "bdep", deployment_spec(),
               deployment_status(), [
                   column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
                   column("Reason", '.status.conditions[?(@.type=="Ready")].reason'),
                   column("Last scaling", ".status.lastScaling.reason", priority=1),
               ], scale=False)


def pool_crd() -> dict[str, Any]:
    return crd(r.POOL_KIND, r.POOL_PLURAL, "wp", pool_spec(), pool_status(), [
        column("Role", ".spec.role"),
        column("Mode", ".spec.autoscaling.mode"),
        column("Desired", ".spec.replicas", "integer"),
        column("Ready", ".status.readyReplicas", "integer"),
        column("GPUs", ".status.gpus", "integer"),
        column("TP", ".spec.tensorParallelSize", "integer", priority=1),
        column("Min", ".spec.minReplicas", "integer", priority=1),
        column("Max", ".spec.maxReplicas", "integer", 1),
        column("Last scaling", ".status.lastScaling.reason"),
        column("Autoscaler", ".status.lastDecision.reason", priority=1),
    ], scale=True)


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in crds/ -> CRD."""
    return {f"{r.DEPLOYMENT_PLURAL}.yaml": deployment_crd(), f"{r.POOL_PLURAL}.yaml": pool_crd()}


class _NoAliasDumper(yaml.SafeDumper):
    """Shared sub-schemas would otherwise come out as YAML anchors, which some Kubernetes tooling
    rejects."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(document: dict[str, Any]) -> str:
    header = ("# Generated by `python -m baton.operators.crd_schema`; "
              "edit operators/crd_schema.py instead.\n")
    return header + yaml.dump(document, Dumper=_NoAliasDumper, sort_keys=False, width=120)


def open_api_schema(kind: str) -> Schema:
    crds = {r.DEPLOYMENT_KIND: deployment_crd, r.POOL_KIND: pool_crd}
    return crds[kind]()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m baton.operators.crd_schema CRDS_DIR", file=sys.stderr)
        return 2
    for name, document in all_crds().items():
        (Path(argv[0]) / name).write_text(render(document), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

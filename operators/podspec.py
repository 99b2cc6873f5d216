"""Pieces every pod the operator makes shares: the restricted security context, owner references,
probes."""
from __future__ import annotations

from typing import Any

from baton.operators import resources as r

Obj = dict[str, Any]

RESTRICTED_CONTAINER: Obj = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_POD: Obj = {
    "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"}
}


def owner_reference(owner: Obj) -> Obj:
    """Makes `owner` the controller of a child, so that Kubernetes garbage-collects the child with
    it."""
    return {
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True
    }


def metadata(owner: Obj, name: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": owner["metadata"]["namespace"], "labels": labels,
            "ownerReferences": [owner_reference(owner)]}


def http_probe(path: str, period: int, failures: int = 3) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
        "failureThreshold": failures
    }


def container(name: str, image: str, pull_policy: str, args: list[str], ports: dict[str, int],
              resources: Obj) -> Obj:
    """`ports` must name an "http" port, where every Baton service serves /health and /ready
    (workers and routers on --metrics-port, with /metrics; the gateway on its API port, with
    /metrics on a "metrics" port). /ready turns 503 while a process drains."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": args,
        "ports": [{"name": port_name, "containerPort": port} for port_name, port in ports.items()],
        "readinessProbe": http_probe("/ready", 5),
        "livenessProbe": http_probe("/health", 15, failures=4),
        "resources": resources,
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def field_env(name: str, field_path: str) -> Obj:
    """An env var from the downward API (the pod's name or IP)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def pod_template(pod: Obj, labels: dict[str, str]) -> Obj:
    """A pod template with the restricted security context and the writable /tmp every container
    mounts (root filesystems are read-only)."""
    pod = {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False, **pod}
    pod["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}] + pod.get("volumes", [])
    return {"metadata": {"labels": labels}, "spec": pod}


def deployment(meta: Obj, selector: dict[str, str], replicas: int, pod: Obj,
               labels: dict[str, str]) -> Obj:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                     "template": pod_template(pod, labels)}}


def service(meta: Obj, selector: dict[str, str], ports: dict[str, int], kind: str = "ClusterIP",
            headless: bool = False) -> Obj:
    spec: Obj = {"type": kind, "selector": selector,
                 "ports": [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                           for name, port in ports.items()]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def disruption_budget(meta: Obj, selector: dict[str, str]) -> Obj:
    """At most one pod of a component down at a time for voluntary disruptions (drains,
    upgrades)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}}}


def service_monitor(meta: Obj, selector: dict[str, str]) -> Obj:
    relabel = [{
        "sourceLabels": [
            f"__meta_kubernetes_pod_label_{label.replace('.', '_').replace('/', '_')}"
        ], "targetLabel": target
    } for label, target in ((r.LABEL_POOL, "pool"), (r.LABEL_ROLE, "role"), (r.LABEL_DEPLOYMENT,
                                                                             "deployment"))]
    return {
        "apiVersion": f"{r.SERVICE_MONITOR_GROUP}/{r.SERVICE_MONITOR_VERSION}",
        "kind": "ServiceMonitor", "metadata": meta, "spec": {
            "selector": {"matchLabels": selector},
            "endpoints": [{"port": "http", "interval": "15s", "relabelings": relabel}]
        }
    }

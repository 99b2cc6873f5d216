"""What a BatonDeployment becomes: a config map, router and gateway (Deployments, Services, PDBs), WorkerPools."""
from __future__ import annotations

import json
from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.settings import OperatorSettings

Obj = dict[str, Any]
CONFIG_DIR = "/etc/baton"


def router_url(name: str, spec: Obj) -> str:
    return f"http://{r.router_name(name)}:{spec['router']['port']}"


def config_map(body: Obj, spec: Obj, settings: OperatorSettings) -> Obj:
    """What the router and gateway read at start: SLOs and where each pool's workers are."""
    name = body["metadata"]["name"]
    pools = {role: {"service": r.pool_name(name, role), "port": settings.worker_port,
                    "workerPool": r.pool_name(name, role)} for role in spec["pools"]}
    config = {"model": spec["model"].get("servedModelName") or name, "slos": spec["slos"], "pools": pools,
              "router": {"url": router_url(name, spec), "policy": spec["router"]["policy"],
                         "drainTimeoutSeconds": spec["router"]["drainTimeoutSeconds"]}}
    meta = podspec.metadata(body, r.config_name(name), r.common_labels(name, "config"))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"config.json": json.dumps(config, indent=2, sort_keys=True)}}


def _component(body: Obj, spec: Obj, component: str, image: str, args: list[str], replicas: int) -> list[Obj]:
    name = body["metadata"]["name"]
    object_name = r.router_name(name) if component == "router" else r.gateway_name(name)
    labels, selector = r.common_labels(name, component), r.selector_labels(name, component)
    port = spec[component]["port"]
    box = podspec.container(component, image, spec["image"]["pullPolicy"],
                            [component, "--port", str(port), "--config", f"{CONFIG_DIR}/config.json", *args], port,
                            spec[component].get("resources", {}))
    box["volumeMounts"].append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    pod = {"containers": [box], "volumes": [{"name": "config", "configMap": {"name": r.config_name(name)}}]}
    kind = spec["gateway"]["serviceType"] if component == "gateway" else "ClusterIP"
    return [podspec.deployment(podspec.metadata(body, object_name, labels), selector, replicas, pod, labels),
            podspec.service(podspec.metadata(body, object_name, labels), selector, port, kind),
            podspec.disruption_budget(podspec.metadata(body, object_name, labels), selector)]


def router_objects(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    image = spec["image"].get("router") or settings.router_image
    return _component(body, spec, "router", image, ["--policy", spec["router"]["policy"]], spec["router"]["replicas"])


def gateway_objects(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    image = spec["image"].get("gateway") or settings.gateway_image
    args = ["--router-url", router_url(body["metadata"]["name"], spec)]
    return _component(body, spec, "gateway", image, args, spec["gateway"]["replicas"])


def worker_pool(body: Obj, spec: Obj, role: str) -> Obj:
    """A WorkerPool carries everything its workers need, so that it reconciles without reading its owner."""
    name = body["metadata"]["name"]
    pool = spec["pools"][role]
    fields = {k: v for k, v in pool.items() if k != "replicas"}
    replicas = pool.get("replicas", pool["minReplicas"])
    labels = {**r.common_labels(name, f"{role}-pool"), r.LABEL_ROLE: role}
    return {"apiVersion": r.API_VERSION, "kind": r.POOL_KIND,
            "metadata": podspec.metadata(body, r.pool_name(name, role), labels),
            "spec": {"deployment": name, "role": role, "replicas": replicas, **fields,
                     "model": spec["model"], "image": spec["image"], "slos": spec["slos"],
                     "drainTimeoutSeconds": spec["router"]["drainTimeoutSeconds"],
                     "routerUrl": router_url(name, spec),
                     "serviceMonitor": spec["monitoring"]["serviceMonitor"]}}


def all_children(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    """In creation order: workers first, then the router that places work on them, then the gateway in front."""
    pools = [worker_pool(body, spec, role) for role in r.ROLES if role in spec["pools"]]
    return [config_map(body, spec, settings), *pools, *router_objects(body, spec, settings),
            *gateway_objects(body, spec, settings)]

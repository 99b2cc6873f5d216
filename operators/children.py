"""What a BatonDeployment becomes: the router (with the RBAC its EndpointSlice watch needs) and the
gateway (Deployments, Services, PDBs), and a WorkerPool per role. Each pod gets its settings as
`baton ...` flags."""
from __future__ import annotations

from typing import Any

from collections.abc import Sequence

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.members import (Member, gateway_models, router_block_size,
                                     router_models)
from baton.operators.model_source import model_mount
from baton.operators.placement import pool_layouts
from baton.operators.settings import OperatorSettings
from baton.operators.state_store import state_store
from baton.operators.workers import served_model_name

Obj = dict[str, Any]
KEYS_DIR = "/etc/baton/keys"
# `baton router --scorers`: least-loaded placement is prefix-aware placement blind to caches
# (the default scorers with prefix_overlap and affinity_key weighted 0); a worker with the
# request's LoRA adapter loaded still counts, as it saves a load, not a prefill.
LEAST_LOADED_SCORERS = ("prefix_overlap:0,affinity_key:0,kv_utilization:1,"
                        "queued_prefill_tokens:1,inflight_requests:1,lora_affinity:1")
POLICY_ARGS = {"prefix-aware": [], "least-loaded": ["--scorers", LEAST_LOADED_SCORERS]}


def router_url(name: str, settings: OperatorSettings) -> str:
    """The router's HTTP server (/stats, /admin/drain), which the operator's autoscaler and drain
    call."""
    return f"http://{r.router_name(name)}:{settings.probe_port}"


def slos_arg(slos: list[Obj]) -> str:
    """`baton gateway --slos`: 'PRIORITY=TTFT_MS/TPOT_MS,...'."""
    return ",".join(f"{s['priority']}={s['ttftMillis']}/{s['tpotMillis']}" for s in slos)


def router_args(body: Obj, spec: Obj, settings: OperatorSettings,
                members: Sequence[Member] = ()) -> list[str]:
    """The router finds workers through the EndpointSlices of the pools' Services, which carry the
    role label and the gateway label: its own pools' and its members' (each member's workers serve
    the member's model, which the router routes too)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    args = [
        "router", "--host", "0.0.0.0", "--port",
        str(spec["router"]["port"]), "--metrics-port",
        str(settings.probe_port), "--kube-label-selector",
        f"{r.LABEL_GATEWAY}={name},{r.LABEL_ROLE}", "--kube-namespace", namespace, "--model",
        served_model_name(name, spec["model"]), *router_models(members),
        *POLICY_ARGS[spec["router"]["policy"]]
    ]
    size = router_block_size(spec)
    return args + (["--block-size", size] if size else [])


def _component(body: Obj, spec: Obj, component: str, box: Obj, pod: Obj,
               ports: dict[str, int]) -> list[Obj]:
    name = body["metadata"]["name"]
    object_name = r.router_name(name) if component == "router" else r.gateway_name(name)
    labels, selector = r.common_labels(name, component), r.selector_labels(name, component)
    kind = spec["gateway"]["serviceType"] if component == "gateway" else "ClusterIP"
    pod = {**pod, "containers": [box]}
    return [podspec.deployment(podspec.metadata(body, object_name, labels), selector,
                               spec[component]["replicas"], pod, labels),
            podspec.service(podspec.metadata(body, object_name, labels), selector, ports, kind),
            podspec.disruption_budget(podspec.metadata(body, object_name, labels), selector)]


def router_rbac(body: Obj) -> list[Obj]:
    """A ServiceAccount that may read the namespace's EndpointSlices, and nothing else."""
    name = body["metadata"]["name"]
    meta = podspec.metadata(body, r.router_name(name), r.common_labels(name, "router"))
    rules = [{
        "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"]
    }]
    return [{
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
        "automountServiceAccountToken": False
    }, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
        "rules": rules
    }, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": meta["name"]}, "subjects": [{
                        "kind": "ServiceAccount", "name": meta["name"],
                        "namespace": body["metadata"]["namespace"]
                    }]
    }]


def router_objects(body: Obj, spec: Obj, settings: OperatorSettings,
                   members: Sequence[Member] = ()) -> list[Obj]:
    image = spec["image"].get("router") or settings.router_image
    ports = {"grpc": spec["router"]["port"], "http": settings.probe_port}
    box = podspec.container("router", image, spec["image"]["pullPolicy"],
                            router_args(body, spec, settings, members), ports,
                            spec["router"].get("resources", {}))
    # Only the router talks to the API server; its token is mounted here and nowhere else.
    pod = {
        "serviceAccountName": r.router_name(body["metadata"]["name"]),
        "automountServiceAccountToken": True
    }
    return [*router_rbac(body), *_component(body, spec, "router", box, pod, ports)]


def gateway_args(body: Obj, spec: Obj, model_path: str, settings: OperatorSettings) -> list[str]:
    """/metrics goes to the probe port, which Prometheus scrapes and the gateway's Service (often
    public) leaves out: it names tenants and their token counts."""
    name = body["metadata"]["name"]
    args = [
        "gateway", "--host", "0.0.0.0", "--port",
        str(spec["gateway"]["port"]), "--metrics-port",
        str(settings.probe_port), "--router", f"{r.router_name(name)}:{spec['router']['port']}",
        "--model", model_path, "--served-model-name",
        served_model_name(name, spec["model"]), "--slos",
        slos_arg(spec["slos"]), "--rate-limit-fail", spec["gateway"]["rateLimitFail"]
    ]
    if spec["gateway"]["allowRuntimeLoraUpdating"]:
        args.append("--allow-runtime-lora-updating")
    secret = spec["gateway"].get("apiKeysSecretRef")
    return args + ([f"--api-keys-file={KEYS_DIR}/{secret['key']}"] if secret else ["--no-auth"])


def rate_limit_store(gateway: Obj) -> list[Obj]:
    """The store's URL as a variable read from its Secret: it may hold a password, which a flag
    would show in the pod spec and in `ps`."""
    secret = gateway.get("rateLimitStoreSecretRef")
    return [{"name": "BATON_RATE_LIMIT_STORE", "valueFrom": {"secretKeyRef": {
        "name": secret["name"], "key": secret["key"]}}}] if secret else []


def gateway_objects(body: Obj, spec: Obj, settings: OperatorSettings,
                    members: Sequence[Member] = ()) -> list[Obj]:
    image = spec["image"].get("gateway") or settings.gateway_image
    source = model_mount(spec["model"], image, spec["image"]["pullPolicy"], tokenizer_only=True)
    more = gateway_models(members, image, spec["image"]["pullPolicy"])
    state = state_store(spec["gateway"])
    box = podspec.container("gateway", image, spec["image"]["pullPolicy"],
                            gateway_args(body, spec, source.path, settings) + more.args +
                            state.args,
                            {"http": spec["gateway"]["port"], "metrics": settings.probe_port},
                            spec["gateway"].get("resources", {}))
    box["volumeMounts"] += source.mounts + more.mounts + state.mounts
    box["env"] = source.env + rate_limit_store(spec["gateway"]) + state.env
    pod: Obj = {"volumes": source.volumes + more.volumes + state.volumes}
    if source.init_containers + more.init_containers:
        pod["initContainers"] = source.init_containers + more.init_containers
    secret = spec["gateway"].get("apiKeysSecretRef")
    if secret:
        box["volumeMounts"].append({"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True})
        pod["volumes"] = pod["volumes"] + [{
            "name": "api-keys", "secret": {"secretName": secret["name"]}
        }]
    objects = _component(body, spec, "gateway", box, pod, {"http": spec["gateway"]["port"]})
    if state.strategy:
        objects[0]["spec"]["strategy"] = state.strategy
    return objects


def worker_pool(body: Obj, spec: Obj, role: str, settings: OperatorSettings,
                front: Obj | None = None) -> Obj:
    """A WorkerPool carries everything its workers need, so that it reconciles without reading its
    owner. `front` is the BatonDeployment whose router and gateway serve the pool (a member's
    primary, its spec defaulted; by default its own): the SLOs, drain timeout and router come from
    it."""
    name = body["metadata"]["name"]
    front = front or body
    front_spec = front["spec"] if front is not body else spec
    pool = spec["pools"][role]
    fields = {k: v for k, v in pool.items() if k != "replicas"}
    replicas = pool.get("replicas", pool["minReplicas"])
    labels = {**r.common_labels(name, f"{role}-pool"), r.LABEL_ROLE: role,
              r.LABEL_GATEWAY: front["metadata"]["name"]}
    return {"apiVersion": r.API_VERSION, "kind": r.POOL_KIND,
            "metadata": podspec.metadata(body, r.pool_name(name, role), labels),
            "spec": {"deployment": name, "role": role, "replicas": replicas, **fields,
                     "model": spec["model"], "image": spec["image"], "slos": front_spec["slos"],
                     "drainTimeoutSeconds": front_spec["router"]["drainTimeoutSeconds"],
                     "routerUrl": router_url(front["metadata"]["name"], settings),
                     "gateway": front["metadata"]["name"],
                     "serviceMonitor": spec["monitoring"]["serviceMonitor"]}}


def worker_pools(body: Obj, spec: Obj, settings: OperatorSettings,
                 front: Obj | None = None) -> list[Obj]:
    """A deployment's WorkerPools; all a member (served by `front`, its primary) gets."""
    spec = {**spec, "pools": pool_layouts(spec["pools"])}
    return [worker_pool(body, spec, role, settings, front) for role in r.ROLES
            if role in spec["pools"]]


def all_children(body: Obj, spec: Obj, settings: OperatorSettings,
                 members: Sequence[Member] = ()) -> list[Obj]:
    """In creation order: workers first (the members' too, owned by them, so that whichever of the
    two reconciles first makes them), then the router that places work on them, then the gateway
    in front; both also serve `members`' models."""
    front = {**body, "spec": spec}
    theirs = [pool for m in members for pool in worker_pools(m.body, m.spec, settings, front)]
    return [*worker_pools(body, spec, settings), *theirs,
            *router_objects(body, spec, settings, members),
            *gateway_objects(body, spec, settings, members)]

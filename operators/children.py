"""What a BatonDeployment becomes: the router (with the RBAC its EndpointSlice watch needs) and the
gateway (Deployments, Services, PDBs), and a WorkerPool per role. Each pod gets its settings as
`baton ...` flags."""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.model_source import model_mount
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


def router_args(body: Obj, spec: Obj, settings: OperatorSettings) -> list[str]:
    """The router finds workers through the EndpointSlices of the pools' Services, which carry the
    role label."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    args = [
        "router", "--host", "0.0.0.0", "--port",
        str(spec["router"]["port"]), "--metrics-port",
        str(settings.probe_port), "--kube-label-selector",
        f"{r.LABEL_DEPLOYMENT}={name},{r.LABEL_ROLE}", "--kube-namespace", namespace, "--model",
        served_model_name(name, spec["model"]), *POLICY_ARGS[spec["router"]["policy"]]
    ]
    # Prefix hashes are per block, so the router must cut prompts as the workers do.
    sizes = {pool.get("engineArgs", {}).get("block-size")
             for pool in spec["pools"].values()} - {None}
    if sizes:
        # engineArgs values are strings: compare them as numbers
        args += ["--block-size", min(sizes, key=int)]
    return args


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


def router_objects(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    image = spec["image"].get("router") or settings.router_image
    ports = {"grpc": spec["router"]["port"], "http": settings.probe_port}
    box = podspec.container("router", image, spec["image"]["pullPolicy"],
                            router_args(body, spec, settings), ports,
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
    secret = spec["gateway"].get("apiKeysSecretRef")
    return args + ([f"--api-keys-file={KEYS_DIR}/{secret['key']}"] if secret else ["--no-auth"])


def rate_limit_store(gateway: Obj) -> list[Obj]:
    """The store's URL as a variable read from its Secret: it may hold a password, which a flag
    would show in the pod spec and in `ps`."""
    secret = gateway.get("rateLimitStoreSecretRef")
    return [{"name": "BATON_RATE_LIMIT_STORE", "valueFrom": {"secretKeyRef": {
        "name": secret["name"], "key": secret["key"]}}}] if secret else []


def gateway_objects(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    image = spec["image"].get("gateway") or settings.gateway_image
    source = model_mount(spec["model"], image, spec["image"]["pullPolicy"], tokenizer_only=True)
    state = state_store(spec["gateway"])
    box = podspec.container("gateway", image, spec["image"]["pullPolicy"],
                            gateway_args(body, spec, source.path, settings) + state.args,
                            {"http": spec["gateway"]["port"], "metrics": settings.probe_port},
                            spec["gateway"].get("resources", {}))
    box["volumeMounts"] += source.mounts + state.mounts
    box["env"] = source.env + rate_limit_store(spec["gateway"]) + state.env
    pod: Obj = {"volumes": source.volumes + state.volumes}
    if source.init_containers:
        pod["initContainers"] = source.init_containers
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


def worker_pool(body: Obj, spec: Obj, role: str, settings: OperatorSettings) -> Obj:
    """A WorkerPool carries everything its workers need, so that it reconciles without reading its
    owner."""
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
                     "routerUrl": router_url(name, settings),
                     "serviceMonitor": spec["monitoring"]["serviceMonitor"]}}


def all_children(body: Obj, spec: Obj, settings: OperatorSettings) -> list[Obj]:
    """In creation order: workers first, then the router that places work on them, then the gateway
    in front."""
    pools = [worker_pool(body, spec, role, settings) for role in r.ROLES if role in spec["pools"]]
    return [*pools, *router_objects(body, spec, settings), *gateway_objects(body, spec, settings)]

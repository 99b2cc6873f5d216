"""A worker pod as a WorkerPool describes it (labels, `baton worker` flags, container, pod spec) and
the Deployment that runs a pool whose replicas each fit one pod."""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.model_source import ModelMount, model_mount
from baton.operators.placement import gpus_per_pod, spans_nodes, tensor_parallel
from baton.operators.settings import OperatorSettings

Obj = dict[str, Any]
# Long enough for the router's EndpointSlice watch to see the pod terminating (and stop placing on
# it) before SIGTERM makes the worker refuse new work; the worker then drains its in-flight requests
# itself.
PRE_STOP_SLEEP_S = 5
STARTUP_PROBE_PERIOD_S = 10
# NCCL between the ranks of a pod, and Ray's object store, work through /dev/shm, which a
# container otherwise gets 64 MiB of.
SHM_VOLUME: Obj = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}


def pool_labels(body: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """(all labels, selector labels) of the pool's pods."""
    spec = body["spec"]
    component = f"{spec['role']}-worker"
    pool = {r.LABEL_POOL: body["metadata"]["name"], r.LABEL_ROLE: spec["role"]}
    return ({**r.common_labels(spec["deployment"], component), **pool}, {
                 **r.selector_labels(spec["deployment"], component), r.LABEL_POOL: body["metadata"]
                                                                                   ["name"]
             })


def served_model_name(deployment: str, model: Obj) -> str:
    """The name clients, the router's prefix hashes and the workers all use; one value for the whole
    deployment."""
    return model.get("servedModelName") or deployment


def worker_args(spec: Obj, settings: OperatorSettings, model_path: str) -> list[str]:
    """`baton worker` flags; the pod's IP and name come in as BATON_ADVERTISE_HOST and
    BATON_WORKER_ID."""
    args = [
        "worker", "--role", spec["role"], "--host", "0.0.0.0", "--port",
        str(settings.worker_port), "--metrics-port",
        str(settings.probe_port), "--kv-transport", spec["kvTransport"], "--model", model_path,
        "--served-model-name",
        served_model_name(spec["deployment"], spec["model"]), "--drain-grace-seconds",
        str(spec["drainTimeoutSeconds"])
    ]
    if tensor_parallel(spec) > 1:
        args += ["--tensor-parallel-size", str(tensor_parallel(spec))]
    if spans_nodes(spec):
        # Ranks on other nodes are Ray actors: the group's leader starts the Ray head.
        args += ["--distributed-executor-backend", "ray"]
    for flag, value in sorted(spec.get("engineArgs", {}).items()):
        args += engine_flag(flag, value)
    return args


def engine_flag(flag: str, value: str) -> list[str]:
    """engineArgs values are strings; "true" and "false" are a switch's two forms (`--enable-lora`,
    `--no-enable-lora`), which take no value."""
    if value in ("true", "false"):
        return [f"--{flag}" if value == "true" else f"--no-{flag}"]
    return [f"--{flag}", value]


def pod_resources(spec: Obj) -> Obj:
    """The pool's CPU and memory, and the GPUs of one pod (one per rank it hosts)."""
    resources = {k: dict(v) for k, v in spec.get("resources", {}).items()}
    if gpus_per_pod(spec):
        resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus_per_pod(spec)
    return resources


def worker_container(body: Obj, settings: OperatorSettings) -> tuple[Obj, ModelMount]:
    spec = body["spec"]
    source = model_mount(spec["model"], spec["image"]["worker"], spec["image"]["pullPolicy"])
    box = podspec.container("worker", spec["image"]["worker"], spec["image"]["pullPolicy"],
                            worker_args(spec, settings, source.path),
                            {"grpc": settings.worker_port, "http": settings.probe_port},
                            pod_resources(spec))
    # /health answers once the model is loaded (and, in a group, every rank has joined): until then
    # liveness must not count, or a slow load is killed and starts over.
    box["startupProbe"] = podspec.http_probe(
        "/health", STARTUP_PROBE_PERIOD_S,
        failures=-(-settings.worker_startup_timeout_seconds // STARTUP_PROBE_PERIOD_S))
    box["volumeMounts"] += source.mounts + shm_mounts(spec)
    # The worker id is the pod name, so the operator's drain (which picks pods) names workers the
    # router knows.
    box["env"] = [podspec.field_env("BATON_ADVERTISE_HOST", "status.podIP"),
                  podspec.field_env("BATON_WORKER_ID", "metadata.name"), *source.env]
    box["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}}
    return box, source


def shm_mounts(spec: Obj) -> list[Obj]:
    return [{"name": "dshm", "mountPath": "/dev/shm"}] if tensor_parallel(spec) > 1 else []


def worker_pod(body: Obj, box: Obj, source: ModelMount) -> Obj:
    """A pod spec around `box` with the model's volumes and the pool's placement; the termination
    grace covers the preStop sleep and the drain."""
    spec = body["spec"]
    pod: Obj = {
        "containers": [box],
        "volumes": source.volumes + ([SHM_VOLUME] if shm_mounts(spec) else []),
        "terminationGracePeriodSeconds": spec["drainTimeoutSeconds"] + PRE_STOP_SLEEP_S + 10
    }
    if source.init_containers:
        pod["initContainers"] = source.init_containers
    if spec.get("nodeSelector"):
        pod["nodeSelector"] = spec["nodeSelector"]
    if spec.get("tolerations"):
        pod["tolerations"] = spec["tolerations"]
    return pod


def worker_deployment(body: Obj, settings: OperatorSettings) -> Obj:
    spec = body["spec"]
    labels, selector = pool_labels(body)
    box, source = worker_container(body, settings)
    meta = podspec.metadata(body, body["metadata"]["name"], labels)
    deployment = podspec.deployment(meta, selector, spec["replicas"], worker_pod(body, box, source),
                                    labels)
    # New workers come up before old ones go: a model load is slow and capacity must not dip.
    deployment["spec"]["strategy"] = {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}
    }
    return deployment

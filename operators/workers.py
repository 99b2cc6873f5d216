"""What a WorkerPool becomes: the workers' Deployment, a headless Service, a PDB and, optionally, a
ServiceMonitor."""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.model_source import ModelMount, model_mount
from baton.operators.settings import OperatorSettings

Obj = dict[str, Any]
# Long enough for the router's EndpointSlice watch to see the pod terminating (and stop placing on
# it) before SIGTERM makes the worker refuse new work; the worker then drains its in-flight requests
# itself.
PRE_STOP_SLEEP_S = 5


def pool_labels(body: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """(all labels, selector labels) of the pool's pods."""
    spec = body["spec"]
    component = f"{spec['role']}-worker"
    pool = {r.LABEL_POOL: body["metadata"]["name"], r.LABEL_ROLE: spec["role"]}
    return ({**r.common_labels(spec["deployment"], component), **pool}, {
                 **r.selector_labels(spec["deployment"], component), r.LABEL_POOL: body["metadata"]
                                                                                   ["name"]
             })


def selector_string(body: Obj) -> str:
    """The pods' selector in the form the scale subresource's labelSelectorPath wants."""
    return ",".join(f"{k}={v}" for k, v in sorted(pool_labels(body)[1].items()))


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
    for flag, value in sorted(spec.get("engineArgs", {}).items()):
        args += [f"--{flag}", value]
    return args


def _worker_container(body: Obj, settings: OperatorSettings) -> tuple[Obj, ModelMount]:
    spec = body["spec"]
    source = model_mount(spec["model"], spec["image"]["worker"], spec["image"]["pullPolicy"])
    resources = {k: dict(v) for k, v in spec.get("resources", {}).items()}
    if spec["gpus"]:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = spec["gpus"]
    box = podspec.container("worker", spec["image"]["worker"], spec["image"]["pullPolicy"],
                            worker_args(spec, settings, source.path),
                            {"grpc": settings.worker_port, "http": settings.probe_port}, resources)
    box["volumeMounts"] += source.mounts
    # The worker id is the pod name, so the operator's drain (which picks pods) names workers the
    # router knows.
    box["env"] = [podspec.field_env("BATON_ADVERTISE_HOST", "status.podIP"),
                  podspec.field_env("BATON_WORKER_ID", "metadata.name"), *source.env]
    box["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}}
    return box, source


def worker_deployment(body: Obj, settings: OperatorSettings) -> Obj:
    spec = body["spec"]
    labels, selector = pool_labels(body)
    box, source = _worker_container(body, settings)
    pod: Obj = {
        "containers": [box], "volumes": source.volumes,
        "terminationGracePeriodSeconds": spec["drainTimeoutSeconds"] + PRE_STOP_SLEEP_S + 10
    }
    if source.init_containers:
        pod["initContainers"] = source.init_containers
    if spec.get("nodeSelector"):
        pod["nodeSelector"] = spec["nodeSelector"]
    if spec.get("tolerations"):
        pod["tolerations"] = spec["tolerations"]
    meta = podspec.metadata(body, body["metadata"]["name"], labels)
    deployment = podspec.deployment(meta, selector, spec["replicas"], pod, labels)
    # New workers come up before old ones go: a model load is slow and capacity must not dip.
    deployment["spec"]["strategy"] = {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}
    }
    return deployment


def pool_objects(body: Obj, settings: OperatorSettings, monitors: bool) -> list[Obj]:
    labels, selector = pool_labels(body)
    name = body["metadata"]["name"]
    objects = [
        worker_deployment(body, settings),
        podspec.service(podspec.metadata(body, name, labels), selector,
                        {"grpc": settings.worker_port, "http": settings.probe_port}, headless=True),
        podspec.disruption_budget(podspec.metadata(body, name, labels), selector)
    ]
    if monitors and body["spec"]["serviceMonitor"]:
        objects.append(podspec.service_monitor(podspec.metadata(body, name, labels), selector))
    return objects

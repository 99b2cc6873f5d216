"""What a WorkerPool becomes: the workers' Deployment, a headless Service, a PDB and, optionally, a ServiceMonitor."""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.settings import OperatorSettings

Obj = dict[str, Any]
MODEL_DIR = "/models"


def pool_labels(body: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """(all labels, selector labels) of the pool's pods."""
    spec = body["spec"]
    component = f"{spec['role']}-worker"
    pool = {r.LABEL_POOL: body["metadata"]["name"], r.LABEL_ROLE: spec["role"]}
    return ({**r.common_labels(spec["deployment"], component), **pool},
            {**r.selector_labels(spec["deployment"], component), r.LABEL_POOL: body["metadata"]["name"]})


def selector_string(body: Obj) -> str:
    """The pods' selector in the form the scale subresource's labelSelectorPath wants."""
    return ",".join(f"{k}={v}" for k, v in sorted(pool_labels(body)[1].items()))


def _model_args(model: Obj) -> tuple[list[str], list[Obj], list[Obj]]:
    """(engine flags, volumes, volume mounts) for the model source."""
    if "pvc" in model:
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": model["pvc"]["claimName"], "readOnly": True}}
        path = f"{MODEL_DIR}/{model['pvc']['path'].strip('/')}".rstrip("/")
        return ["--model", path], [volume], [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}]
    args = ["--model", model.get("huggingFace") or model["uri"]]
    if model.get("revision"):
        args += ["--revision", model["revision"]]
    return args, [], []


def _worker_container(body: Obj, settings: OperatorSettings) -> tuple[Obj, list[Obj]]:
    spec, name = body["spec"], body["spec"]["deployment"]
    model_args, volumes, mounts = _model_args(spec["model"])
    args = ["worker", "--role", spec["role"], "--port", str(settings.worker_port), *model_args,
            "--served-model-name", spec["model"].get("servedModelName") or name,
            "--tensor-parallel-size", str(spec["tensorParallelSize"])]
    for flag, value in sorted(spec.get("engineArgs", {}).items()):
        args += [f"--{flag}", value]
    resources = {k: dict(v) for k, v in spec.get("resources", {}).items()}
    if spec["gpus"]:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = spec["gpus"]
    box = podspec.container("worker", spec["image"]["worker"], spec["image"]["pullPolicy"], args,
                            settings.worker_port, resources)
    box["volumeMounts"] += mounts + [{"name": "cache", "mountPath": "/cache"}]
    box["env"] = [{"name": "HF_HOME", "value": "/cache"}]
    secret = spec["model"].get("tokenSecretRef")
    if secret:
        box["env"].append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret["name"],
                                                                            "key": secret["key"]}}})
    # preStop asks the worker to stop taking work; SIGTERM then waits for in-flight requests to finish.
    box["lifecycle"] = {"preStop": {"httpGet": {"path": "/admin/drain", "port": "http"}}}
    return box, volumes + [{"name": "cache", "emptyDir": {}}]


def worker_deployment(body: Obj, settings: OperatorSettings) -> Obj:
    spec = body["spec"]
    labels, selector = pool_labels(body)
    box, volumes = _worker_container(body, settings)
    pod: Obj = {"containers": [box], "volumes": volumes,
                "terminationGracePeriodSeconds": spec["drainTimeoutSeconds"] + 10}
    if spec.get("nodeSelector"):
        pod["nodeSelector"] = spec["nodeSelector"]
    if spec.get("tolerations"):
        pod["tolerations"] = spec["tolerations"]
    meta = podspec.metadata(body, body["metadata"]["name"], labels)
    deployment = podspec.deployment(meta, selector, spec["replicas"], pod, labels)
    # New workers come up before old ones go: a model load is slow and capacity must not dip.
    deployment["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return deployment


def pool_objects(body: Obj, settings: OperatorSettings, monitors: bool) -> list[Obj]:
    labels, selector = pool_labels(body)
    name = body["metadata"]["name"]
    objects = [worker_deployment(body, settings),
               podspec.service(podspec.metadata(body, name, labels), selector, settings.worker_port, headless=True),
               podspec.disruption_budget(podspec.metadata(body, name, labels), selector)]
    if monitors and body["spec"]["serviceMonitor"]:
        objects.append(podspec.service_monitor(podspec.metadata(body, name, labels), selector))
    return objects

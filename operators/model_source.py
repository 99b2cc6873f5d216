"""Where a pod finds the checkpoint: `baton worker --model` and `baton gateway --model` take a local
folder, so a PersistentVolumeClaim is mounted, and a Hugging Face id is downloaded by an init
container into an emptyDir."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baton.operators import podspec

Obj = dict[str, Any]
MODEL_DIR = "/models"
CACHE_DIR = "/cache"
# What the gateway needs of a checkpoint: the tokenizer, its chat template and the config (context
# length).
TOKENIZER_FILES = ["*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
# The images carry huggingface_hub (a dependency of transformers); argv keeps the id out of the code
# string.
DOWNLOAD = (
    "import sys, huggingface_hub; huggingface_hub.snapshot_download(sys.argv[1], "
    "revision=sys.argv[2] or "
    "None, local_dir=sys.argv[3], allow_patterns=sys.argv[4].split(',') if sys.argv[4] else None)")


@dataclass
class ModelMount:
    path: str  # the folder to pass as --model
    volumes: list[Obj] = field(default_factory=list)
    mounts: list[Obj] = field(default_factory=list)
    init_containers: list[Obj] = field(default_factory=list)
    env: list[Obj] = field(default_factory=list)


def token_env(model: Obj) -> list[Obj]:
    secret = model.get("tokenSecretRef")
    if not secret:
        return []
    return [{
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": secret["name"], "key": secret["key"]}}
    }]


def model_mount(model: Obj, image: str, pull_policy: str, tokenizer_only: bool = False,
                slot: str = "") -> ModelMount:
    """The volumes, init container and env that put `model` at a local path in the pod; `slot`
    names a further model's volume, folder and init container apart (a gateway in front of
    several)."""
    cache = {"name": "cache", "emptyDir": {}}
    env = [{"name": "HF_HOME", "value": CACHE_DIR}, *token_env(model)]
    cache_mount = {"name": "cache", "mountPath": CACHE_DIR}
    volume_name, model_dir = f"model{slot}", f"{MODEL_DIR}{slot}"
    mount = {"name": volume_name, "mountPath": model_dir, "readOnly": True}
    if "pvc" in model:
        volume = {
            "name": volume_name,
            "persistentVolumeClaim": {"claimName": model["pvc"]["claimName"], "readOnly": True}
        }
        path = f"{model_dir}/{model['pvc']['path'].strip('/')}".rstrip("/")
        return ModelMount(path, [volume, cache], [mount, cache_mount], env=env)
    path = f"{model_dir}/{model['huggingFace'].replace('/', '--')}"
    patterns = ",".join(TOKENIZER_FILES) if tokenizer_only else ""
    fetch = {
        "name": f"fetch-model{slot}", "image": image, "imagePullPolicy": pull_policy, "command": [
            "python", "-c", DOWNLOAD, model["huggingFace"],
            model.get("revision", ""), path, patterns
        ], "env": env, "securityContext": podspec.RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": volume_name, "mountPath": model_dir}, cache_mount]
    }
    return ModelMount(path, [{"name": volume_name, "emptyDir": {}}, cache],
                      [mount, cache_mount], [fetch], env)

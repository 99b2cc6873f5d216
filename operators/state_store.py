"""Where the gateway keeps stored responses and usage records (its --state-store): PostgreSQL from
a Secret when spec.gateway.stateStoreSecretRef names one (read as BATON_STATE_STORE, the
production form that several replicas share), else a SQLite file on a volume of its single
replica: spec.gateway.stateStoreVolume's PersistentVolumeClaim, or an emptyDir (lost with the
pod). The container's root filesystem is read-only, so without one of them /v1/responses would
have nowhere to write."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
STATE_DIR = "/var/lib/baton/state"
SQLITE_URL = f"sqlite:///{STATE_DIR}/state.db"
VOLUME = "state"
DEFAULT_SIZE_LIMIT = "1Gi"


@dataclass
class StateStoreMount:
    """What the gateway's container and pod get for their state store."""
    args: list[str] = field(default_factory=list)
    env: list[Obj] = field(default_factory=list)
    volumes: list[Obj] = field(default_factory=list)
    mounts: list[Obj] = field(default_factory=list)
    # Recreate: a pod holding a ReadWriteOnce claim must stop before the next one can mount it
    strategy: Obj | None = None


def state_store(gateway: Obj) -> StateStoreMount:
    """The gateway's state store from its part of a (defaulted) BatonDeployment spec."""
    secret = gateway.get("stateStoreSecretRef")
    if secret:
        return StateStoreMount(env=[{"name": "BATON_STATE_STORE", "valueFrom": {
            "secretKeyRef": {"name": secret["name"], "key": secret["key"]}}}])
    volume = gateway.get("stateStoreVolume", {})
    claim = volume.get("claimName")
    source: Obj = ({"persistentVolumeClaim": {"claimName": claim}} if claim else
                   {"emptyDir": {"sizeLimit": volume.get("sizeLimit", DEFAULT_SIZE_LIMIT)}})
    return StateStoreMount(args=[f"--state-store={SQLITE_URL}"],
                           volumes=[{"name": VOLUME, **source}],
                           mounts=[{"name": VOLUME, "mountPath": STATE_DIR}],
                           strategy={"type": "Recreate"} if claim else None)

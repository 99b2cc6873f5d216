"""Runs the real operator (kopf, all handlers) against kmock, a Kubernetes API emulator, in its own
thread."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest_asyncio

from baton.operators import resources as r
from baton.operators.autoscaler.policy import Signals
from baton.operators.autoscaler.signals import PoolRef
from baton.operators.handlers import register
from baton.operators.kube import Kube, new_api_client
from baton.operators.placement import LWS_API_VERSION, LWS_KIND
from baton.operators.settings import OperatorSettings

NAMESPACE = "llm"
RESOURCES = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    "v1/serviceaccounts": {"kind": "ServiceAccount", "namespaced": True},
    "rbac.authorization.k8s.io/v1/roles": {"kind": "Role", "namespaced": True},
    "rbac.authorization.k8s.io/v1/rolebindings": {"kind": "RoleBinding", "namespaced": True},
    "v1/services": {"kind": "Service", "namespaced": True},
    "v1/pods": {"kind": "Pod", "namespaced": True},
    "apps/v1/deployments": {
        "kind": "Deployment", "namespaced": True, "subresources": ["scale", "status"]
    },
    "policy/v1/poddisruptionbudgets": {"kind": "PodDisruptionBudget", "namespaced": True},
    f"{r.API_VERSION}/{r.DEPLOYMENT_PLURAL}": {
        "kind": r.DEPLOYMENT_KIND, "namespaced": True, "subresources": ["status"]
    },
    f"{r.API_VERSION}/{r.POOL_PLURAL}": {
        "kind": r.POOL_KIND, "namespaced": True, "subresources": ["status", "scale"]
    },
    # The LWS controller's CRD, as on a cluster where it is installed.
    f"{LWS_API_VERSION}/leaderworkersets": {
        "kind": LWS_KIND, "namespaced": True, "subresources": ["status", "scale"]
    },
}


class EmulatorKube(Kube):
    """Stamps what the API server would on creation (uid, resourceVersion); kmock assigns neither,
    and kopf cannot handle objects the operator made itself without them."""

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> Any:
        if method == "POST" and isinstance(body, dict):
            meta = body.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("resourceVersion", "1")
        return await super().call(method, path, body, content_type)


class FakeSource:
    """Signals the test sets per pool name; the autoscaler reads them as it would the router's."""

    def __init__(self) -> None:
        self.signals: dict[str, Signals] = {}

    async def fetch(self, pool: PoolRef) -> Signals:
        return self.signals.get(pool.name, Signals())


class Operator:
    def __init__(self, kube: Kube, source: FakeSource, kmock: Any) -> None:
        self.kube, self.source, self.kmock = kube, source, kmock

    def writes(self) -> list[tuple[str, str, Any]]:
        """Every object-changing request kmock has seen so far: (method, path, body)."""
        return [(q.method.value.upper(), q.url.path, q.data) for q in self.kmock
                if q.method.value.upper() in ("POST", "PATCH", "PUT",
                                              "DELETE") and "/events" not in q.url.path]


class RecordingKube(EmulatorKube):
    """Remembers its own writes, apart from whatever the running operator does meanwhile."""

    def __init__(self, api: Any) -> None:
        super().__init__(api)
        self.written: list[str] = []

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> Any:
        if method != "GET":
            self.written.append(f"{method} {path}")
        return await super().call(method, path, body, content_type)


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_operator(kmock: Any, resources: dict[str, Any]) -> AsyncIterator[Operator]:
    """The operator against kmock serving `resources` (the API groups of the emulated cluster)."""
    for key, info in resources.items():
        # Without verbs kopf deems a resource unwatchable and silently serves nothing.
        kmock.resources[key] = {
            **info, "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]
        }
    url = str(kmock.url).rstrip("/")
    kube, source = EmulatorKube(new_api_client(host=url)), FakeSource()
    config = OperatorSettings(autoscale_interval_seconds=0.2, metrics_port=0, health_port=0)
    registry = kopf.OperatorRegistry()
    register(registry, config)

    @kopf.on.startup(registry=registry)
    def fast_exit(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Workers linger after the stop flag otherwise; the tests' objects need no graceful drain.
        settings.queueing.exit_timeout = 0.1
        settings.queueing.idle_timeout = 0.5
        settings.background.cancellation_polling = 0.2
        settings.background.instant_exit_timeout = 0.2

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, insecure=True)

    stop, ready = threading.Event(), threading.Event()
    memo = kopf.Memo(config=config, kube=kube, source=source)
    thread = threading.Thread(
        target=lambda: asyncio.run(
            kopf.operator(registry=registry, memo=memo, standalone=True, clusterwide=True, stop_flag
                          =stop, ready_flag=ready)), daemon=True)
    thread.start()
    op = Operator(kube, source, kmock)
    # kmock replays existing objects to each new watch: create objects only once kopf watches.
    await eventually(
        lambda: any(q.params.get("watch") and r.POOL_PLURAL in q.url.path for q in kmock))
    await eventually(
        lambda: any(q.params.get("watch") and r.DEPLOYMENT_PLURAL in q.url.path for q in kmock))
    try:
        yield op
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 10)


@pytest_asyncio.fixture()
async def operator(kmock: Any) -> AsyncIterator[Operator]:
    async with running_operator(kmock, RESOURCES) as op:
        yield op


@pytest_asyncio.fixture()
async def operator_without_lws(kmock: Any) -> AsyncIterator[Operator]:
    """A cluster where the LeaderWorkerSet controller (and its CRD) is not installed."""
    resources = {k: v for k, v in RESOURCES.items() if not k.startswith(LWS_API_VERSION)}
    async with running_operator(kmock, resources) as op:
        yield op

"""The router's EndpointSlice watch against kmock (a Kubernetes API emulator): the synchronous
kubernetes client lists, then follows a scale-up, an endpoint turning terminating, and a slice's
deletion."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes.client import DiscoveryV1Api

from baton.operators.kube import new_api_client
from baton.services.router.discovery import EndpointSliceWatcher
from tests.operators.conftest import EmulatorKube

NAMESPACE = "llm"
RESOURCE = "discovery.k8s.io/v1/endpointslices"
PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


def endpoint_slice(name: str, hosts: dict[str, bool]) -> dict[str, Any]:
    """A slice of the worker Service: host -> terminating."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": "workers"}
        }, "ports": [{"name": "grpc", "port": 8100, "protocol": "TCP"}], "endpoints": [{
            "addresses": [host],
            "conditions": {"ready": not terminating, "serving": True, "terminating": terminating}
        } for host, terminating in hosts.items()]
    }


async def published(views: list[dict[str, bool]], expected: dict[str, bool],
                    timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (views and views[-1] == expected):
        assert time.monotonic() < deadline, f"last published {views[-1:]} never became {expected}"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_watch_follows_scale_up_termination_and_deletion(kmock: Any) -> None:
    kmock.resources[RESOURCE] = {
        "kind": "EndpointSlice", "namespaced": True,
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]
    }
    url = str(kmock.url).rstrip("/")
    kube = EmulatorKube(new_api_client(host=url))
    await kube.call("POST", PATH, endpoint_slice("workers-a", {"10.0.0.1": False}))
    views: list[dict[str, bool]] = []
    watcher = EndpointSliceWatcher(NAMESPACE, "kubernetes.io/service-name=workers", "grpc",
                                   views.append, api=DiscoveryV1Api(new_api_client(host=url)))
    watcher.start()
    try:
        await published(views, {"10.0.0.1:8100": False})
        await kube.call("POST", PATH,
                        endpoint_slice("workers-b", {"10.0.0.2": False, "10.0.0.3": False}))
        await published(views,
                        {"10.0.0.1:8100": False, "10.0.0.2:8100": False, "10.0.0.3:8100": False})
        await kube.call("PATCH", f"{PATH}/workers-b",
                        endpoint_slice("workers-b", {"10.0.0.2": False, "10.0.0.3": True}),
                        content_type="application/merge-patch+json")
        await published(views,
                        {"10.0.0.1:8100": False, "10.0.0.2:8100": False, "10.0.0.3:8100": True})
        await kube.call("DELETE", f"{PATH}/workers-a")
        await published(views, {"10.0.0.2:8100": False, "10.0.0.3:8100": True})
    finally:
        # The watch thread sees the stop flag at its next event; kmock's teardown waits for the
        # stream to close.
        watcher.stop()
        await kube.call("POST", PATH, endpoint_slice("workers-c", {}))
        await asyncio.to_thread(watcher._thread.join, 10)
    assert not watcher._thread.is_alive()

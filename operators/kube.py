"""A small Kubernetes REST layer over the official client: get, create-or-patch, delete, list, by
kind.

Apply is read-compare-write rather than server-side apply so that a reconcile whose objects already
match sends no write at all (idempotence is checked by counting writes), and so that it works
against test emulators.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import kubernetes

from baton.operators import resources as r
from baton.operators.placement import LWS_API_VERSION, LWS_KIND

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Outcome = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Kind:
    api_version: str
    plural: str

    def path(self, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


KINDS = {
    "Service": Kind("v1", "services"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "Pod": Kind("v1", "pods"),
    "Deployment": Kind("apps/v1", "deployments"),
    LWS_KIND: Kind(LWS_API_VERSION, "leaderworkersets"),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "ServiceMonitor": Kind(f"{r.SERVICE_MONITOR_GROUP}/{r.SERVICE_MONITOR_VERSION}",
                           "servicemonitors"),
    r.DEPLOYMENT_KIND: Kind(r.API_VERSION, r.DEPLOYMENT_PLURAL),
    r.POOL_KIND: Kind(r.API_VERSION, r.POOL_PLURAL),
}


def is_subset(want: Any, have: Any) -> bool:
    """Whether `have` already contains everything in `want` (extra fields, e.g. server defaults, are
    fine)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k])
                                              for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have or (isinstance(want, (int, float)) and isinstance(have, str) and
                            str(want) == have)


def new_api_client(host: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster credentials, else the kubeconfig; `host` (tests) talks to that server without
    credentials."""
    if host is not None:
        config = kubernetes.client.Configuration(host=host)
        return kubernetes.client.ApiClient(config)
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


class Kube:
    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    def _call_sync(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> Any:
        query = None
        if "?" in path:
            path, raw = path.split("?", 1)
            query = [tuple(pair.split("=", 1)) for pair in raw.split("&")]
        request = self.api.param_serialize(
            method, path, query_params=query, body=body, auth_settings=["BearerToken"],
            header_params={"Content-Type": content_type, "Accept": "application/json"})
        response = self.api.call_api(*request)
        data = response.read()
        if response.status >= 400:
            raise kubernetes.client.ApiException(status=response.status, reason=response.reason,
                                                 body=data)
        return json.loads(data) if data else None

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> Any:
        # The official client is synchronous; a thread keeps kopf's event loop free.
        return await asyncio.to_thread(self._call_sync, method, path, body, content_type)

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return await self.call("GET", KINDS[kind].path(namespace, name))
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]:
        query = ",".join(f"{k}={v}" for k, v in selector.items())
        found = await self.call("GET",
                                KINDS[kind].path(namespace) + f"?labelSelector={query}") or {}
        # Emulators may ignore the selector; filtering again keeps the answer right either way.
        return [
            o for o in found.get("items", [])
            if is_subset(selector, o["metadata"].get("labels", {}))
        ]

    async def patch(self, kind: str, namespace: str, name: str, body: Obj,
                    sub: str | None = None) -> Obj:
        return await self.call("PATCH", KINDS[kind].path(namespace, name, sub), body,
                               "application/merge-patch+json")

    async def apply(self, obj: Obj, keep_live: tuple[str, ...] = (),
                    exact: tuple[str, ...] = ()) -> Outcome:
        """Create `obj`, or patch it where the live object differs; top-level spec fields in
        `keep_live` are only set at creation (e.g. replicas, which the scale subresource owns
        afterwards); maps under the top-level spec fields in `exact` lose the keys `obj` lacks
        (e.g. a Service's selector)."""
        meta = obj["metadata"]
        live = await self.get(obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            await self.call("POST", KINDS[obj["kind"]].path(meta["namespace"]), obj)
            return "created"
        want = obj
        if "spec" in obj:
            spec = {k: v for k, v in obj["spec"].items() if k not in keep_live}
            for field in exact:
                stale = set(live.get("spec", {}).get(field) or {}) - set(spec.get(field) or {})
                if stale:
                    # A merge patch keeps keys it does not mention; null deletes them.
                    spec[field] = {**spec.get(field, {}), **dict.fromkeys(stale)}
            want = {**obj, "spec": spec}
        if is_subset(want, live):
            return "unchanged"
        await self.patch(obj["kind"], meta["namespace"], meta["name"], want)
        return "updated"

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        try:
            await self.call("DELETE", KINDS[kind].path(namespace, name))
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    async def served(self, api_version: str) -> bool:
        """Whether the cluster serves an API group version (e.g. the Prometheus Operator's)."""
        try:
            await self.call("GET", f"/apis/{api_version}")
        except kubernetes.client.ApiException:
            return False
        return True

"""Scale-down without dropping work: pick the pods to remove, tell the router to stop sending them
work, and mark them so that the ReplicaSet removes exactly those. Their SIGTERM drain then finishes
in-flight requests.

Workers run with --worker-id set to their pod name (operators/workers.py), so the router's drain
takes pod names."""
from __future__ import annotations

import logging
from typing import Any

import aiohttp

from baton.operators import resources as r
from baton.operators.kube import Kube

log = logging.getLogger(__name__)
Obj = dict[str, Any]


def _ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def choose_victims(pods: list[Obj], count: int) -> list[str]:
    """Pods that are not serving go first, then the youngest, whose prefix caches are coldest."""
    alive = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    not_ready = [p for p in alive if not _ready(p)]
    ready = sorted((p for p in alive if _ready(p)),
                   key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
    return [p["metadata"]["name"] for p in (not_ready + ready)[:max(count, 0)]]


async def drain(kube: Kube, session: aiohttp.ClientSession, pool: Obj, selector: dict[str, str],
                remove: int, drain_path: str) -> list[str]:
    """Prepares `remove` pods of the pool for removal; returns their names."""
    namespace, spec = pool["metadata"]["namespace"], pool["spec"]
    victims = choose_victims(await kube.list("Pod", namespace, selector), remove)
    for name in victims:
        await kube.patch("Pod", namespace, name,
                         {"metadata": {"annotations": {r.POD_DELETION_COST: r.DRAINED_COST}}})
    if victims and spec.get("routerUrl"):
        body = {"worker_ids": victims}
        try:
            async with session.post(spec["routerUrl"].rstrip("/") + drain_path,
                                    json=body) as response:
                response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as e:
            # Not fatal: the router also stops placing on a terminating endpoint once the pod is
            # deleted.
            log.warning("router drain of %s failed: %s", victims, e)
    return victims

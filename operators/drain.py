"""Scale-down without dropping work: pick the pods to remove, tell the router to stop sending them
work, and mark them so that the ReplicaSet removes exactly those (a LeaderWorkerSet removes its
highest groups, whose leaders are drained). Their SIGTERM drain then finishes in-flight requests.

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


def group_leaders(name: str, current: int, wanted: int) -> list[str]:
    """The leaders of the groups a LeaderWorkerSet removes when scaled from `current` to `wanted`:
    its leaders are a StatefulSet, which removes the highest ordinals first, so no pod can be
    chosen (a deletion cost would be ignored)."""
    return [f"{name}-{index}" for index in range(current - 1, wanted - 1, -1)]


async def tell_router(session: aiohttp.ClientSession, pool: Obj, victims: list[str],
                      drain_path: str) -> None:
    """Asks the pool's router to place nothing more on `victims` (worker ids: pod names)."""
    url = pool["spec"].get("routerUrl")
    if not victims or not url:
        return
    try:
        async with session.post(url.rstrip("/") + drain_path,
                                json={"worker_ids": victims}) as response:
            response.raise_for_status()
    except (aiohttp.ClientError, TimeoutError) as e:
        # Not fatal: the router also stops placing on a terminating endpoint once the pod is
        # deleted.
        log.warning("router drain of %s failed: %s", victims, e)


async def drain(kube: Kube, session: aiohttp.ClientSession, pool: Obj, selector: dict[str, str],
                remove: int, drain_path: str) -> list[str]:
    """Prepares `remove` pods of the pool for removal; returns their names."""
    namespace = pool["metadata"]["namespace"]
    victims = choose_victims(await kube.list("Pod", namespace, selector), remove)
    for name in victims:
        await kube.patch("Pod", namespace, name,
                         {"metadata": {"annotations": {r.POD_DELETION_COST: r.DRAINED_COST}}})
    await tell_router(session, pool, victims, drain_path)
    return victims


async def drain_groups(session: aiohttp.ClientSession, pool: Obj, current: int,
                       drain_path: str) -> list[str]:
    """Prepares a LeaderWorkerSet pool's scale-down to spec.replicas groups: the router stops
    placing on the leaders that go; returns their names."""
    victims = group_leaders(pool["metadata"]["name"], current, pool["spec"]["replicas"])
    await tell_router(session, pool, victims, drain_path)
    return victims

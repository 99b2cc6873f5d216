"""Making a BatonDeployment's children match its spec. A primary and its members (BatonDeployments
with gatewayRef) share the primary's router and gateway, whose flags list every member's model:
the primary's reconcile, each member's and each member's delete all rewrite them, each from the
members it lists, so they run one at a time per primary (the operator is one process), and the
last one's list is the live one."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from baton.operators import resources as r
from baton.operators import spec as specs
from baton.operators.children import Obj, all_children, worker_pools
from baton.operators.kube import Kube
from baton.operators.members import Member, find_members, join_problems
from baton.operators.settings import OperatorSettings


@dataclass
class Joined:
    """How a member's reconcile went: what changed, or why it could not join."""
    changes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    primary_found: bool = True


def front_lock(locks: dict[str, asyncio.Lock], namespace: str, name: str) -> asyncio.Lock:
    return locks.setdefault(f"{namespace}/{name}", asyncio.Lock())


async def apply_children(kube: Kube, body: Obj, spec: Obj, children: list[Obj]) -> list[str]:
    """Creates or patches `children`, and deletes `body`'s pools its spec dropped; returns what
    changed (empty when all already matched)."""
    changes = []
    for child in children:
        keep = ("replicas",) if child["kind"] == r.POOL_KIND else ()
        outcome = await kube.apply(child, keep_live=keep)
        if outcome != "unchanged":
            changes.append(f"{outcome} {child['kind']}/{child['metadata']['name']}")
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    for role in r.ROLES:
        # A pool removed from the spec goes; looking first keeps a reconcile with nothing to do free
        # of writes.
        pool = r.pool_name(name, role)
        if role not in spec["pools"] and await kube.get(r.POOL_KIND, namespace, pool) is not None:
            await kube.delete(r.POOL_KIND, namespace, pool)
            changes.append(f"deleted {r.POOL_KIND}/{pool}")
    return changes


async def sync_children(kube: Kube, body: Obj, spec: Obj, config: OperatorSettings,
                        members: list[Member] | None = None) -> list[str]:
    """Every child of a primary, serving `members`' models too (and making their pools)."""
    return await apply_children(kube, body, spec, all_children(body, spec, config, members or []))


async def sync_primary(kube: Kube, locks: dict[str, asyncio.Lock], body: Obj, spec: Obj,
                       config: OperatorSettings, leaving: str | None = None) -> list[str]:
    """A primary's children with the members live now (but `leaving`, which is being deleted or
    has moved to another gateway)."""
    async with front_lock(locks, body["metadata"]["namespace"], body["metadata"]["name"]):
        members, _ = await find_members(kube, body, leaving)
        return await sync_children(kube, body, spec, config, members)


async def sync_member(kube: Kube, locks: dict[str, asyncio.Lock], body: Obj, spec: Obj,
                      config: OperatorSettings) -> Joined:
    """A member's pools, and its primary's router and gateway made to serve its model."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    ref = spec["gatewayRef"]["name"]
    primary = None if ref == name else await kube.get(r.DEPLOYMENT_KIND, namespace, ref)
    problems = join_problems(name, spec, primary, set())
    if problems or primary is None:
        return Joined(problems=problems, primary_found=primary is not None or ref == name)
    async with front_lock(locks, namespace, ref):
        members, refused = await find_members(kube, primary)
        if name in refused:
            return Joined(problems=refused[name])
        front_spec = specs.defaulted(r.DEPLOYMENT_KIND, primary)
        front = {**primary, "spec": front_spec}
        # Its own pools first, so that a role it dropped goes; the primary's sync applies the rest.
        changes = await apply_children(kube, body, spec, worker_pools(body, spec, config, front))
        return Joined(changes + await sync_children(kube, primary, front_spec, config, members))


async def leave(kube: Kube, locks: dict[str, asyncio.Lock], body: Obj,
                config: OperatorSettings) -> None:
    """A deleted member's model leaves its primary's router and gateway."""
    ref = ((body.get("spec") or {}).get("gatewayRef") or {}).get("name")
    primary = await kube.get(r.DEPLOYMENT_KIND, body["metadata"]["namespace"],
                             ref) if ref else None
    if primary is None or "gatewayRef" in (primary.get("spec") or {}):
        return
    spec = specs.defaulted(r.DEPLOYMENT_KIND, primary)
    if not specs.problems(r.DEPLOYMENT_KIND, spec):
        await sync_primary(kube, locks, primary, spec, config, leaving=body["metadata"]["name"])

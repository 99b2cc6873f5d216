"""The kopf handlers: BatonDeployments into their children, WorkerPools into workers, and the
autoscaler timer.

Handlers are registered on a registry passed in, so that the CLI and the tests each run their own
operator with their own settings. Everything the handlers share (API client, HTTP session, signal
source, autoscaler state) lives in kopf's `memo`, made at startup.
"""
from __future__ import annotations

import logging
from typing import Any

import aiohttp
import kopf

from baton.operators import conditions, drain, spec as specs
from baton.operators import resources as r
from baton.operators.autoscaler.gpu_seconds import GpuSeconds
from baton.operators.autoscaler.loop import evaluate
from baton.operators.autoscaler.signals import PrometheusSource, RouterStatsSource
from baton.operators.kube import Kube, new_api_client
from baton.operators.placement import (LWS_API_VERSION, LWS_KIND, other_workload_kind,
                                       workload_kind)
from baton.operators.pools import pool_objects, selector_string
from baton.operators.settings import OperatorSettings
from baton.operators.sync import leave, sync_member, sync_primary
from baton.operators.workers import pool_labels

log = logging.getLogger(__name__)
Obj = dict[str, Any]
FINALIZER = f"{r.GROUP}/finalizer"


def set_status(patch: kopf.Patch, status: Obj, fields: Obj) -> None:
    """Patch only the status fields that differ, so that a reconcile with nothing to do writes
    nothing."""
    for key, value in fields.items():
        if status.get(key) != value:
            patch.status[key] = value


async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
    config: OperatorSettings = memo.config
    settings.persistence.finalizer = FINALIZER
    settings.peering.standalone = True
    settings.posting.level = logging.INFO
    memo.kube = memo.get("kube") or Kube(new_api_client())
    memo.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
        total=config.signal_timeout_seconds))
    memo.source = memo.get("source") or (PrometheusSource(memo.session, config.prometheus_url)
                                         if config.prometheus_url else
                                         RouterStatsSource(memo.session, config.router_stats_path))
    memo.states = {}
    memo.front_locks = {}
    memo.gpu_seconds = GpuSeconds()
    memo.monitors = await memo.kube.served(f"{r.SERVICE_MONITOR_GROUP}/{r.SERVICE_MONITOR_VERSION}")


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.session.close()


async def reconcile_deployment(body: kopf.Body, meta: kopf.Meta, status: kopf.Status,
                               patch: kopf.Patch, memo: kopf.Memo, old: Any = None,
                               **_: Any) -> None:
    obj = dict(body)
    spec = specs.defaulted(r.DEPLOYMENT_KIND, obj)
    before = ((old or {}).get("spec") or {}).get("gatewayRef")
    if before and before != spec.get("gatewayRef"):
        # A member that moved to another gateway (or became a primary) leaves the one it was behind.
        await leave(memo.kube, memo.front_locks, {**obj, "spec": old["spec"]}, memo.config)
    problems = specs.problems(r.DEPLOYMENT_KIND, spec)
    previous = status.get("conditions")
    if problems:
        set_status(patch, status,
                   {"conditions": conditions.invalid(problems, meta.get("generation"), previous)})
        kopf.warn(obj, reason="InvalidSpec", message="; ".join(problems))
        return
    if "gatewayRef" in spec:
        joined = await sync_member(memo.kube, memo.front_locks, obj, spec, memo.config)
        if joined.problems:
            # Retried: its primary may appear, or the member whose model name it wants may go.
            reason = "GatewayNotFound" if not joined.primary_found else "GatewayRefRejected"
            message = "; ".join(joined.problems)
            set_status(patch, status, {"conditions": conditions.unplaceable(
                reason, message, meta.get("generation"), previous,
                "retried until it can join its gateway")})
            raise kopf.TemporaryError(message, delay=30)
        changes = joined.changes
    else:
        changes = await sync_primary(memo.kube, memo.front_locks, obj, spec, memo.config)
    if changes:
        kopf.info(obj, reason="Reconciled", message=", ".join(changes))
    pools = {role: status.get("pools", {}).get(role, {}) for role in spec["pools"]}
    set_status(
        patch, status, {
            "observedGeneration": meta.get("generation"), "conditions": conditions.from_pools(
                pools, meta.get("generation"), previous)
        })


async def delete_deployment(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Gateway first, so that no new request arrives at a router or pool that is going away (a
    member's model leaves its primary's router and gateway before its pools go)."""
    await leave(memo.kube, memo.front_locks, dict(body), memo.config)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    for kind, child in [("Deployment", r.gateway_name(name)), ("Service", r.gateway_name(name)),
                        ("PodDisruptionBudget", r.gateway_name(name)),
                        ("Deployment", r.router_name(name)), ("Service", r.router_name(name)),
                        ("PodDisruptionBudget", r.router_name(name)),
                        ("RoleBinding", r.router_name(name)), ("Role", r.router_name(name)),
                        ("ServiceAccount", r.router_name(name))
                        ] + [(r.POOL_KIND, r.pool_name(name, x)) for x in r.ROLES]:
        await memo.kube.delete(kind, namespace, child)


async def reconcile_pool(body: kopf.Body, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
                         memo: kopf.Memo, **_: Any) -> None:
    obj = dict(body)
    spec = specs.defaulted(r.POOL_KIND, obj)
    problems = specs.problems(r.POOL_KIND, spec)
    previous = status.get("conditions")
    if problems:
        set_status(patch, status,
                   {"conditions": conditions.invalid(problems, meta.get("generation"), previous)})
        kopf.warn(obj, reason="InvalidSpec", message="; ".join(problems))
        return
    full = {**obj, "spec": spec}
    kube: Kube = memo.kube
    kind = workload_kind(spec)
    if kind == LWS_KIND and not await kube.served(LWS_API_VERSION):
        message = (f"tensorParallelSize {spec['tensorParallelSize']} spans nodes of "
                   f"{spec['gpusPerNode']} GPUs, which needs the LeaderWorkerSet API "
                   f"({LWS_API_VERSION}): install the LWS controller")
        set_status(patch, status, {"conditions": conditions.unplaceable(
            "LeaderWorkerSetMissing", message, meta.get("generation"), previous)})
        # Retried, so that installing LWS is enough; kopf logs it and posts it as an event, and
        # writes the status above meanwhile.
        raise kopf.TemporaryError(message, delay=60)
    await drain_for_scale_down(kube, memo, full, kind)
    for child in pool_objects(full, memo.config, memo.monitors):
        await apply_child(kube, obj, child)
    other = other_workload_kind(spec)
    if await kube.get(other, meta["namespace"], meta["name"]) is not None:
        # The pool switched placement (its tensorParallelSize crossed gpusPerNode).
        await kube.delete(other, meta["namespace"], meta["name"])
        kopf.info(obj, reason="Reconciled", message=f"deleted {other}/{meta['name']}")
    set_status(patch, status, {
        "selector": selector_string(full), "observedGeneration": meta.get("generation"),
        "workload": kind, "conditions": conditions.pool_placed(meta.get("generation"), previous)})


async def apply_child(kube: Kube, pool: Obj, child: Obj) -> None:
    # A Service's selector must be exactly the wanted one: a pool that stops spanning nodes drops
    # the leader-only label, or its new pods would never become endpoints.
    outcome = await kube.apply(child, exact=("selector",) if child["kind"] == "Service" else ())
    if outcome != "unchanged":
        kopf.info(pool, reason="Reconciled",
                  message=f"{outcome} {child['kind']}/{child['metadata']['name']}")


async def drain_for_scale_down(kube: Kube, memo: kopf.Memo, pool: Obj, kind: str) -> None:
    """Before the workload shrinks to spec.replicas, the router stops placing on what goes."""
    meta, spec = pool["metadata"], pool["spec"]
    live = await kube.get(kind, meta["namespace"], meta["name"])
    live_replicas = (live or {}).get("spec", {}).get("replicas", 0)
    if live is None or spec["replicas"] >= live_replicas:
        return
    if kind == LWS_KIND:
        victims = await drain.drain_groups(memo.session, pool, live_replicas,
                                           memo.config.router_drain_path)
    else:
        victims = await drain.drain(kube, memo.session, pool, pool_labels(pool)[1],
                                    live_replicas - spec["replicas"],
                                    memo.config.router_drain_path)
    kopf.info(pool, reason="Draining",
              message=f"{live_replicas} -> {spec['replicas']}: {', '.join(victims)}")


async def delete_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    for kind in ("Deployment", LWS_KIND, "Service", "PodDisruptionBudget", "ServiceMonitor"):
        if kind != "ServiceMonitor" or memo.monitors:
            await memo.kube.delete(kind, namespace, name)
    memo.states.pop(f"{namespace}/{name}", None)
    memo.gpu_seconds.forget(f"{namespace}/{name}")


async def autoscale_pool(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo,
                         **_: Any) -> None:
    obj = dict(body)
    spec = specs.defaulted(r.POOL_KIND, obj)
    if specs.problems(r.POOL_KIND, spec):
        return

    def emit(reason: str, message: str) -> None:
        kopf.event(obj, type="Normal", reason=reason, message=message)

    _, fields = await evaluate(memo.kube, memo.source, {**obj, "spec": spec}, spec, memo.states,
                               emit, memo.gpu_seconds)
    set_status(patch, status, fields)
    await publish_to_owner(memo.kube, obj, spec, fields)


async def publish_to_owner(kube: Kube, pool: Obj, spec: Obj, fields: Obj) -> None:
    """The owning BatonDeployment shows each pool's replicas, its last scaling and its
    conditions."""
    namespace = pool["metadata"]["namespace"]
    owner = await kube.get(r.DEPLOYMENT_KIND, namespace, spec["deployment"])
    if owner is None:
        return
    status = owner.get("status") or {}
    entry = {
        "replicas": spec["replicas"], "readyReplicas": fields["readyReplicas"],
        "desiredReplicas": fields.get("desiredReplicas",
                                      spec["replicas"]), "mode": spec["autoscaling"]["mode"],
        "gpus": fields["gpus"]
    }
    pools = {**status.get("pools", {}), spec["role"]: entry}
    want: Obj = {"pools": pools}
    if "lastScaling" in fields:
        want["lastScaling"] = fields["lastScaling"]
    if not specs.problems(r.DEPLOYMENT_KIND, specs.defaulted(r.DEPLOYMENT_KIND, owner)):
        want["conditions"] = conditions.from_pools(pools, owner["metadata"].get("generation"),
                                                   status.get("conditions"))
    changed = {k: v for k, v in want.items() if status.get(k) != v}
    if changed:
        await kube.patch(r.DEPLOYMENT_KIND, namespace, spec["deployment"], {"status": changed},
                         sub="status")


def register(registry: kopf.OperatorRegistry, config: OperatorSettings) -> None:
    """Puts every handler on `registry`; the autoscaler runs every --autoscale-interval-seconds per
    pool."""
    deployments, pools = (r.GROUP, r.VERSION, r.DEPLOYMENT_PLURAL), (r.GROUP, r.VERSION,
                                                                     r.POOL_PLURAL)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    for resource, handler in ((deployments, reconcile_deployment), (pools, reconcile_pool)):
        kopf.on.create(*resource, registry=registry)(handler)
        kopf.on.resume(*resource, registry=registry)(handler)
        # Only spec changes: status and annotation patches (ours and kopf's) must not re-trigger a
        # reconcile.
        kopf.on.update(*resource, registry=registry, field="spec")(handler)
    kopf.on.delete(*deployments, registry=registry)(delete_deployment)
    kopf.on.delete(*pools, registry=registry)(delete_pool)
    kopf.timer(*pools, registry=registry, interval=config.autoscale_interval_seconds,
               initial_delay=config.autoscale_interval_seconds)(autoscale_pool)

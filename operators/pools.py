"""What a WorkerPool becomes: its workload (a Deployment, or a LeaderWorkerSet when a replica spans
nodes), a headless Service the router discovers the workers by, a PDB and, optionally, a
ServiceMonitor."""
from __future__ import annotations

from typing import Any

from baton.operators import podspec
from baton.operators import resources as r
from baton.operators.leaderworkerset import leader_worker_set
from baton.operators.placement import LWS_WORKER_INDEX, spans_nodes
from baton.operators.settings import OperatorSettings
from baton.operators.workers import pool_labels, worker_deployment

Obj = dict[str, Any]


def endpoint_selector(body: Obj) -> dict[str, str]:
    """The pods that serve the pool: in a LeaderWorkerSet only the leaders, which run `baton
    worker`; the other pods of a group only host ranks and must never be routed to."""
    selector = pool_labels(body)[1]
    return {**selector, LWS_WORKER_INDEX: "0"} if spans_nodes(body["spec"]) else selector


def selector_string(body: Obj) -> str:
    """The serving pods' selector in the form the scale subresource's labelSelectorPath wants: one
    pod per replica, so that an HPA counts replicas."""
    return ",".join(f"{k}={v}" for k, v in sorted(endpoint_selector(body).items()))


def workload(body: Obj, settings: OperatorSettings) -> Obj:
    if spans_nodes(body["spec"]):
        return leader_worker_set(body, settings)
    return worker_deployment(body, settings)


def pool_objects(body: Obj, settings: OperatorSettings, monitors: bool) -> list[Obj]:
    labels, selector = pool_labels(body)
    name = body["metadata"]["name"]
    serving = endpoint_selector(body)
    # The router selects the Services' EndpointSlices (which copy the Service's labels) by the
    # gateway label; the pods go without it, so that adding it restarts no worker.
    gateway = {r.LABEL_GATEWAY: body["spec"].get("gateway") or body["spec"]["deployment"]}
    objects = [
        workload(body, settings),
        podspec.service(podspec.metadata(body, name, {**labels, **gateway}), serving,
                        {"grpc": settings.worker_port, "http": settings.probe_port}, headless=True),
        # Every pod of the pool: evicting any rank stops its whole group.
        podspec.disruption_budget(podspec.metadata(body, name, labels), selector)
    ]
    if monitors and body["spec"]["serviceMonitor"]:
        # Selects the Service above by its labels; its endpoints are the serving pods only.
        objects.append(podspec.service_monitor(podspec.metadata(body, name, labels), selector))
    return objects

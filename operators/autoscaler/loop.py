"""One autoscaler evaluation of one WorkerPool: observe, decide with the pure policy, act, and
explain."""
from __future__ import annotations

import datetime
import logging
import time
from dataclasses import replace
from typing import Any, Callable

from baton.operators import metrics
from baton.operators.autoscaler.gpu_seconds import GpuSeconds
from baton.operators.autoscaler.policy import (Decision, PoolState, Policy, Signals, StepRules,
                                               decide, next_state)
from baton.operators.autoscaler.signals import PoolRef, SignalSource
from baton.operators.kube import Kube
from baton.operators.placement import LWS_GROUP_INDEX, gpus_per_replica, workload_kind
from baton.operators.workers import pool_labels, served_model_name

log = logging.getLogger(__name__)
Obj = dict[str, Any]
Emit = Callable[[str, str], None]  # (reason, message) -> a Kubernetes event on the pool


def policy_from_spec(spec: Obj) -> Policy:
    auto = spec["autoscaling"]

    def steps(d: Obj) -> StepRules:
        return StepRules(stabilization_s=d["stabilizationSeconds"], max_step=d["maxStep"],
                         cooldown_s=d["cooldownSeconds"])

    ttfts = [s["ttftMillis"] / 1000 for s in spec.get("slos", [])]
    return Policy(role=spec["role"], min_replicas=spec["minReplicas"],
                  max_replicas=spec["maxReplicas"], ttft_target_s=min(ttfts) if ttfts else None,
                  mode=auto["mode"], queue_time_budget=auto["queueTimeBudgetPercent"] / 100,
                  token_utilization=auto["tokenUtilizationPercent"] / 100,
                  kv_high=auto["kvCacheHighPercent"] / 100, kv_low=auto["kvCacheLowPercent"] / 100,
                  tpot_attainment=auto["tpotAttainmentPercent"] / 100,
                  min_goodput_gain=auto["minGoodputGainPercent"] / 100,
                  goodput_guard_s=auto["goodputGuardSeconds"], scale_to_zero=auto["scaleToZero"],
                  idle_before_zero_s=auto["idleSecondsBeforeZero"], up=steps(auto["scaleUp"]),
                  down=steps(auto["scaleDown"]))


async def observe(kube: Kube, body: Obj) -> Obj:
    """The pool's replica counts as its workload and pods report them. A replica is a whole
    tensor-parallel group: a LeaderWorkerSet counts groups, and a group with any pod Pending is
    one pending replica."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    live = await kube.get(workload_kind(body["spec"]), namespace, name) or {}
    pods = await kube.list("Pod", namespace, pool_labels(body)[1])
    pending = {p["metadata"].get("labels", {}).get(LWS_GROUP_INDEX, p["metadata"]["name"])
               for p in pods if p.get("status", {}).get("phase") == "Pending"}
    status = live.get("status", {})
    replicas = status.get("replicas", 0)
    return {"replicas": replicas, "readyReplicas": status.get("readyReplicas", 0),
            "pendingReplicas": len(pending), "gpus": replicas * gpus_per_replica(body["spec"])}


async def fetch_signals(source: SignalSource, body: Obj) -> Signals:
    spec = body["spec"]
    meta = body["metadata"]
    ref = PoolRef(meta["namespace"], meta["name"], spec["deployment"], spec.get("routerUrl", ""),
                  spec["role"], served_model_name(spec["deployment"], spec["model"]))
    try:
        return await source.fetch(ref)
    # Any failure of a signal source means "no signals", never a crash.
    except Exception as e:  # noqa: BLE001
        log.info("no signals for %s: %s", ref.name, e)
        return Signals()


def record(body: Obj, decision: Decision, emit: Emit, previous_reason: str | None) -> Obj:
    """Status entry, metric and (on a move or a new reason) event for a decision."""
    name = body["metadata"]["name"]
    metrics.DECISIONS.labels(pool=name, direction=decision.direction,
                             reason=decision.reason.value).inc()
    metrics.DESIRED.labels(pool=name).set(decision.replicas)
    entry = {"from": decision.current, "to": decision.replicas, "direction": decision.direction,
             "reason": decision.reason.value, "message": decision.message, "pool": name,
             "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if decision.direction != "hold" or decision.reason.value != previous_reason:
        # A replica is a whole tensor-parallel group: say what a move costs in GPUs.
        per_replica = gpus_per_replica(body["spec"])
        emit(decision.reason.value,
             f"{decision.current} -> {decision.replicas} ({decision.current * per_replica} -> "
             f"{decision.replicas * per_replica} GPUs): {decision.message}")
    return entry


async def evaluate(kube: Kube, source: SignalSource, body: Obj, spec: Obj,
                   states: dict[str, PoolState], emit: Emit, gpu_seconds: GpuSeconds,
                   now: float | None = None) -> tuple[Decision | None, Obj]:
    """Runs one evaluation; returns the decision (None for a manual pool) and the pool's new status
    fields."""
    now = now if now is not None else time.time()
    observed = await observe(kube, body)
    status: Obj = {**observed}
    key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    gpu_seconds.observe(key, body["metadata"]["name"], observed["gpus"], now)
    if spec["autoscaling"]["mode"] == "manual":
        return None, status
    policy, signals = policy_from_spec(spec), await fetch_signals(source, body)
    base = states.get(key) or PoolState(replicas=spec["replicas"], now=0.0)
    state = replace(base, replicas=spec["replicas"], ready_replicas=observed["readyReplicas"],
                    pending_replicas=observed["pendingReplicas"], now=now)
    decision = decide(signals, state, policy)
    keep = max(policy.up.stabilization_s, policy.down.stabilization_s)
    states[key] = next_state(state, decision, signals, keep_s=keep)
    previous = (body.get("status") or {}).get("lastDecision", {}).get("reason")
    entry = record(body, decision, emit, previous)
    status.update(lastDecision=entry, desiredReplicas=decision.replicas)
    if decision.direction != "hold":
        status["lastScaling"] = entry
        await kube.patch("WorkerPool", body["metadata"]["namespace"], body["metadata"]["name"],
                         {"spec": {"replicas": decision.replicas}})
    return decision, status

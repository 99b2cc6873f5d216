"""Ready / Progressing / Degraded conditions, each with a reason, in the shape `kubectl wait`
understands."""
from __future__ import annotations

import datetime
from typing import Any

Obj = dict[str, Any]


def condition(kind: str, ok: bool, reason: str, message: str, generation: int | None,
              previous: list[Obj] | None = None) -> Obj:
    status = "True" if ok else "False"
    old = next((c for c in previous or [] if c.get("type") == kind), None)
    # lastTransitionTime moves only when the status flips, so repeated reconciles leave it (and the
    # object) alone.
    unchanged = old and old.get("status") == status and old.get("lastTransitionTime")
    since = (old["lastTransitionTime"] if unchanged
             else datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


def invalid(problems: list[str], generation: int | None, previous: list[Obj] | None) -> list[Obj]:
    message = "; ".join(problems)
    return [
        condition("Degraded", True, "InvalidSpec", message, generation, previous),
        condition("Ready", False, "InvalidSpec", "the spec breaks its schema's rules", generation,
                  previous),
        condition("Progressing", False, "InvalidSpec",
                  "nothing is reconciled until the spec is fixed", generation, previous)
    ]


def from_pools(pools: dict[str, Obj], generation: int | None,
               previous: list[Obj] | None) -> list[Obj]:
    """Ready when every pool has all its wanted replicas ready; Progressing while any is still on
    its way."""
    waiting = sorted(role for role, p in pools.items()
                     if p.get("readyReplicas", 0) < max(p.get("desiredReplicas", 1), 1))
    ready = not waiting
    text = "all pools ready" if ready else "waiting for pools: " + ", ".join(waiting)
    return [
        condition("Ready", ready, "PoolsReady" if ready else "PoolsNotReady", text, generation,
                  previous),
        condition("Progressing", not ready, "Reconciled" if ready else "ScalingPools", text,
                  generation, previous),
        condition("Degraded", False, "AsExpected", "spec is valid", generation, previous)
    ]


def pool_placed(generation: int | None, previous: list[Obj] | None) -> list[Obj]:
    """A pool whose objects were made: a Degraded it had (a spec since fixed, a missing API since
    installed) clears."""
    return [condition("Degraded", False, "AsExpected", "spec is valid and placed", generation,
                      previous)]


def unplaceable(reason: str, message: str, generation: int | None, previous: list[Obj] | None,
                progress: str = "retried until the cluster can place the pool") -> list[Obj]:
    """A valid spec the cluster cannot run as it stands (e.g. an API it needs is not installed, a
    gateway it names is missing)."""
    return [
        condition("Degraded", True, reason, message, generation, previous),
        condition("Ready", False, reason, message, generation, previous),
        condition("Progressing", False, reason, progress, generation, previous)
    ]

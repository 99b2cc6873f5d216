"""The load each pool (role) of live workers carries, as the autoscaler reads it (GetStats), and
the per-worker rows of the router's load gauges."""
from __future__ import annotations

from collections.abc import Iterable

from baton.services.common.messages.router import PoolStats
from baton.services.common.roles import Role
from baton.services.router.metrics import WorkerLoadRow
from baton.services.router.worker_state import SaturationLimits, WorkerState


def pool_stats(live: list[WorkerState], now: float,
               limits: SaturationLimits) -> dict[Role, PoolStats]:
    """One PoolStats per role, over the live workers of that role (zeros for an empty pool)."""
    pools = {}
    for role in Role:
        members = [w for w in live if w.role is role]
        pools[role] = PoolStats(
            len(members), sum(w.queued_prefill_tokens() for w in members),
            sum(w.inflight_requests() for w in members),
            sum(w.kv_utilization() for w in members) / len(members) if members else 0.0,
            sum(w.is_saturated(now, limits) for w in members))
    return pools


def load_rows(workers: Iterable[WorkerState], now: float) -> list[WorkerLoadRow]:
    """A gauge row per registered worker, live or not (a stale one shows its stats' age)."""
    return [WorkerLoadRow(w.worker_id, w.queued_prefill_tokens(), w.inflight_requests(),
                          w.kv_utilization(), min(w.stats_age(now), 1e9)) for w in workers]

"""Usage records: one per request, inserted 'in_progress' when it starts, brought up to date while
it runs, and settled once when it ends. A record left 'in_progress' by a gateway that died (not
updated for a while) is settled 'failed' by whichever gateway sweeps first, keeping what it
served."""
from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, insert, select, update

from baton.services.state.schema import usage
from baton.services.state.store import StateStore

IN_PROGRESS = "in_progress"
COLUMNS = [c.name for c in usage.columns]


async def insert_usage(store: StateStore, record: dict[str, Any]) -> None:
    async with store.transaction() as conn:
        await conn.execute(insert(usage).values(**record))


async def update_usage(store: StateStore, record_id: str, values: dict[str, Any],
                       only_in_progress: bool = False) -> bool:
    """Whether a row was updated; with only_in_progress, a settled row is left as it is."""
    condition = usage.c.id == record_id
    if only_in_progress:
        condition = and_(condition, usage.c.status == IN_PROGRESS)
    async with store.transaction() as conn:
        result = await conn.execute(update(usage).where(condition).values(**values))
    return result.rowcount > 0


async def settle_stale(store: StateStore, stale_after_s: float) -> int:
    """Marks 'failed' the records in progress that nobody updated for stale_after_s (their gateway
    died); how many."""
    now = time.time()
    async with store.transaction() as conn:
        result = await conn.execute(update(usage).where(
            usage.c.status == IN_PROGRESS, usage.c.updated_at < now - stale_after_s).values(
                status="failed", ended_at=usage.c.updated_at))
    return result.rowcount


async def query_usage(store: StateStore, since: float | None = None,
                      tenant: str | None = None) -> list[dict[str, Any]]:
    """Records started at or after `since` (epoch seconds), of one tenant or all, oldest first."""
    query = select(usage).order_by(usage.c.started_at, usage.c.id)
    if since is not None:
        query = query.where(usage.c.started_at >= since)
    if tenant is not None:
        query = query.where(usage.c.tenant == tenant)
    async with store.transaction() as conn:
        rows = (await conn.execute(query)).all()
    return [dict(row._mapping) for row in rows]

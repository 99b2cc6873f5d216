"""The runtime LoRA adapters' record (schema.runtime_loras): what gateways re-assert to the router.
Keyed by base model and adapter name; a load writes (or rewrites) its row, an unload deletes it."""
from __future__ import annotations

import time

from sqlalchemy import and_, delete, insert, select

from baton.services.state.schema import runtime_loras
from baton.services.state.store import StateStore

# (base model, adapter name) -> the adapter's folder
Recorded = dict[tuple[str, str], str]


async def recorded_loras(store: StateStore) -> Recorded:
    async with store.transaction() as conn:
        rows = (await conn.execute(select(runtime_loras))).all()
    return {(row.model, row.name): row.path for row in rows}


async def record_load(store: StateStore, model: str, name: str, path: str) -> None:
    async with store.transaction() as conn:
        await conn.execute(delete(runtime_loras).where(_row(model, name)))
        await conn.execute(insert(runtime_loras).values(model=model, name=name, path=path,
                                                        loaded_at=time.time()))


async def record_unload(store: StateStore, model: str, name: str) -> None:
    async with store.transaction() as conn:
        await conn.execute(delete(runtime_loras).where(_row(model, name)))


def _row(model: str, name: str) -> object:
    return and_(runtime_loras.c.model == model, runtime_loras.c.name == name)

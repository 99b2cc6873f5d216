"""Stored responses, read and written for one tenant at a time: a row of another tenant is never
found. Expired rows (past `expires_at`) are invisible at once and deleted by `expire`."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select, update

from baton.services.state.schema import responses
from baton.services.state.store import StateStore


@dataclass
class StoredResponse:
    id: str
    status: str
    body: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]


def _mine(tenant: str, response_id: str, now: float) -> Any:
    return and_(responses.c.id == response_id, responses.c.tenant == tenant,
                or_(responses.c.expires_at.is_(None), responses.c.expires_at > now))


async def insert_response(store: StateStore, tenant: str, stored: StoredResponse,
                          ttl_s: float | None) -> None:
    now = time.time()
    async with store.transaction() as conn:
        await conn.execute(insert(responses).values(
            id=stored.id, tenant=tenant, status=stored.status, created_at=now,
            expires_at=now + ttl_s if ttl_s else None, body=json.dumps(stored.body),
            input_items=json.dumps(stored.input_items),
            conversation=json.dumps(stored.conversation)))


async def finish_response(store: StateStore, tenant: str, stored: StoredResponse,
                          unless_status: str | None = None) -> bool:
    """Writes a response's final body and conversation; with unless_status, not over a row in that
    status (a background response cancelled meanwhile). Whether the row was written."""
    condition = _mine(tenant, stored.id, time.time())
    if unless_status is not None:
        condition = and_(condition, responses.c.status != unless_status)
    async with store.transaction() as conn:
        result = await conn.execute(update(responses).where(condition).values(
            status=stored.status, body=json.dumps(stored.body),
            conversation=json.dumps(stored.conversation)))
    return result.rowcount > 0


async def get_response(store: StateStore, tenant: str, response_id: str) -> StoredResponse | None:
    async with store.transaction() as conn:
        row = (await conn.execute(select(responses).where(
            _mine(tenant, response_id, time.time())))).first()
    if row is None:
        return None
    return StoredResponse(row.id, row.status, json.loads(row.body), json.loads(row.input_items),
                          json.loads(row.conversation))


async def delete_response(store: StateStore, tenant: str, response_id: str) -> bool:
    async with store.transaction() as conn:
        result = await conn.execute(delete(responses).where(
            _mine(tenant, response_id, time.time())))
    return result.rowcount > 0


async def expire_responses(store: StateStore) -> int:
    """Deletes every expired response; how many."""
    async with store.transaction() as conn:
        result = await conn.execute(delete(responses).where(
            responses.c.expires_at.is_not(None), responses.c.expires_at <= time.time()))
    return result.rowcount

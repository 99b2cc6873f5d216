"""The state store on SQLite and on PostgreSQL, without a gateway: migrations (concurrent ones
too), tenant scoping, expiry, usage records settled once, and a store that is down."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from baton.services.common.process import free_port
from baton.services.gateway.usage_meter import UsageMeter
from baton.services.openai.render import Choice
from baton.services.state.responses_repo import (StoredResponse, delete_response,
                                                 expire_responses, finish_response,
                                                 get_response, insert_response)
from baton.services.state.store import StateStore
from baton.services.state.urls import StoreUnavailable
from baton.services.state.usage_repo import insert_usage, query_usage, settle_stale
from tests.responses.conftest import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> Iterator[str]:
    """A fresh store per test: a SQLite file, or a PostgreSQL database created and dropped."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    with fresh_database("baton_store") as pg:
        yield pg


def _response(response_id: str, status: str = "completed") -> StoredResponse:
    return StoredResponse(response_id, status, {"id": response_id, "status": status},
                          [{"id": "msg_1"}], [{"id": "msg_1"}])


def _usage(record_id: str, tenant: str, updated_at: float) -> dict:
    return {"id": record_id, "tenant": tenant, "key_id": None, "endpoint": "/v1/responses",
            "model": "m", "adapter": None, "prompt_tokens": 3, "cached_tokens": 0,
            "completion_tokens": 2, "status": "in_progress", "started_at": updated_at,
            "updated_at": updated_at}


def test_gateways_starting_together_migrate_once(url):
    """Each store its own connections, as gateway replicas have: on PostgreSQL they wait on one
    advisory lock (without it this test was seen to hang: the timeout makes that a failure)."""
    async def run() -> None:
        stores = [StateStore(url) for _ in range(3)]
        await asyncio.wait_for(asyncio.gather(*(s.ready() for s in stores)), timeout=120)
        await insert_response(stores[0], "t", _response("resp_a"), None)
        assert (await get_response(stores[2], "t", "resp_a")).body["id"] == "resp_a"
        for store in stores:
            await store.close()

    asyncio.run(run())


def test_tenants_expiry_and_conditional_writes(url):
    async def run() -> None:
        store = StateStore(url)
        await insert_response(store, "alpha", _response("resp_1", "in_progress"), None)
        await insert_response(store, "alpha", _response("resp_2"), ttl_s=0.5)
        assert await get_response(store, "beta", "resp_1") is None
        assert not await delete_response(store, "beta", "resp_1")
        assert not await finish_response(store, "beta", _response("resp_1"))
        await finish_response(store, "alpha", _response("resp_1", "cancelled"))
        # a background response cancelled meanwhile keeps its status
        assert not await finish_response(store, "alpha", _response("resp_1"),
                                         unless_status="cancelled")
        assert (await get_response(store, "alpha", "resp_1")).status == "cancelled"
        await asyncio.sleep(0.6)
        assert await get_response(store, "alpha", "resp_2") is None  # expired: invisible at once
        assert await expire_responses(store) == 1
        assert await delete_response(store, "alpha", "resp_1")
        assert await get_response(store, "alpha", "resp_1") is None
        await store.close()

    asyncio.run(run())


def test_usage_records_are_settled_once(url):
    async def run() -> None:
        store = StateStore(url)
        now = time.time()
        await insert_usage(store, _usage("dead", "alpha", now - 100))
        await insert_usage(store, _usage("live", "beta", now))
        assert await settle_stale(store, stale_after_s=50) == 1
        assert await settle_stale(store, stale_after_s=50) == 0
        by_id = {r["id"]: r for r in await query_usage(store)}
        assert by_id["dead"]["status"] == "failed" and by_id["dead"]["completion_tokens"] == 2
        assert by_id["live"]["status"] == "in_progress"
        assert [r["id"] for r in await query_usage(store, tenant="beta")] == ["live"]
        assert await query_usage(store, since=now + 1) == []
        await store.close()

    asyncio.run(run())


def test_a_meter_whose_store_was_down_at_the_start_still_writes_one_record(url):
    async def run() -> None:
        store = StateStore(url)
        failures = Counter("failures", "", ["operation"], registry=CollectorRegistry())
        meter = UsageMeter(store, failures, stale_after_s=60, response_ttl_s=None)
        state = Choice(0, [1, 2, 3])
        # the insert fails: the engine points at nothing meanwhile
        good_engine = store.engine
        store.engine = StateStore(
            f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout_s=1).engine
        ticket = meter.open("req-1", "alpha", None, "/v1/chat/completions", "m", 3, [state])
        await asyncio.wait({ticket.opened})
        assert failures.labels("insert")._value.get() == 1
        store.engine = good_engine
        state.token_ids, state.finish_reason = [7, 8], "stop"
        meter.settle(ticket, "completed")
        meter.settle(ticket, "completed")
        await meter.drain()
        [record] = await query_usage(store)
        assert (record["id"], record["status"], record["completion_tokens"]) == (
            "req-1", "completed", 2)
        await store.close()

    asyncio.run(run())


def test_a_store_that_is_down_raises_store_unavailable():
    async def run() -> None:
        store = StateStore(f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                           connect_timeout_s=2)
        with pytest.raises(StoreUnavailable):
            await get_response(store, "alpha", "resp_1")
        await store.close()

    asyncio.run(run())


def test_a_migration_lock_held_too_long_is_a_store_unavailable_not_a_hang(tmp_path, monkeypatch):
    """A gateway never waits for ever on another one's migration of a shared SQLite file: it
    starts without its store (retried when a request needs it)."""
    import fcntl

    from baton.services.state import store as store_module
    monkeypatch.setattr(store_module, "MIGRATION_LOCK_WAIT_S", 0.5)
    path = tmp_path / "state.db"
    with open(f"{path}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's flock conflicts the same way
        store = StateStore(f"sqlite:///{path}")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="held"):
            asyncio.run(store.ready())
        assert time.monotonic() - started < 60
    asyncio.run(store.ready())  # once the lock is free the schema is migrated
    asyncio.run(store.close())

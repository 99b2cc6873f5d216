"""The bucket stores on their own: the in-process one and the Redis one answer alike (take both
buckets or neither, refuse with how long to wait, give back, run into debt), and the Redis scripts
stay atomic when many clients take from one tenant's bucket at once."""
from __future__ import annotations

import asyncio
import time

import pytest

from baton.services.gateway.rate_limits.memory import MemoryStore
from baton.services.gateway.rate_limits.redis_store import RedisStore
from tests.redis_store import REDIS_URL, connect, prefix, saved_level  # noqa: F401


@pytest.fixture(params=["memory", "redis"])
def store(request, prefix):
    return MemoryStore() if request.param == "memory" else RedisStore(REDIS_URL, prefix, 5.0)


def run(coroutine):
    return asyncio.run(coroutine)


def test_takes_until_empty_then_says_how_long_to_wait(store):
    async def scenario():
        taken = [await store.take("t", None, 600, 200) for _ in range(3)]
        refused = await store.take("t", None, 600, 600)
        await store.close()
        return taken, refused

    taken, refused = run(scenario())
    assert taken == [None] * 3
    # a minute's worth from an empty bucket: a minute, less what refilled while the test ran
    assert refused.what == "tokens" and refused.limit == 600 and 30 < refused.wait_s <= 60


def test_more_than_a_minutes_worth_is_never_granted(store):
    async def scenario():
        refused = await store.take("t", 5, 600, 601)
        granted = await store.take("t", 5, 600, 600)
        await store.close()
        return refused, granted

    refused, granted = run(scenario())
    assert refused.wait_s == float("inf") and refused.amount == 601
    assert granted is None  # the refusal took nothing from the requests bucket


def test_both_buckets_or_neither(store):
    async def scenario():
        first = await store.take("t", 2, 1000, 900)
        # the tokens bucket refuses: the request must not be charged to the requests bucket
        refused = await store.take("t", 2, 1000, 900)
        second = await store.take("t", 2, 1000, 50)
        third = await store.take("t", 2, 1000, 1)
        await store.close()
        return first, refused, second, third

    first, refused, second, third = run(scenario())
    assert first is None and refused.what == "tokens" and second is None
    assert third.what == "requests" and third.limit == 2


def test_given_back_tokens_can_be_taken_again_and_a_debt_is_waited_for(store):
    async def scenario():
        assert await store.take("t", None, 600, 600) is None
        await store.adjust("t", 600, 500)  # the request used 100 of its 600
        again = await store.take("t", None, 600, 450)
        await store.adjust("t", 600, -1000)  # a request that used far more than it reserved
        indebted = await store.take("t", None, 600, 1)
        await store.close()
        return again, indebted

    again, indebted = run(scenario())
    assert again is None
    # about 950 tokens below zero at 10 per second: over a minute and a half to wait, less what
    # refilled while the test ran
    assert indebted.what == "tokens" and indebted.wait_s > 60


def test_tenants_have_buckets_of_their_own(store):
    async def scenario():
        results = [await store.take("a", None, 100, 100), await store.take("b", None, 100, 100),
                   await store.take("a", None, 100, 100)]
        await store.close()
        return results

    a, b, a_again = run(scenario())
    assert a is None and b is None and a_again is not None


def test_the_script_is_atomic_under_concurrent_clients(prefix):
    """200 takes of 10 tokens from a 1000-token bucket, from 20 clients (connections of their own)
    with 10 calls in flight each. A read-then-write would let many of them see the same tokens
    free; the script grants exactly what the bucket holds plus what refilled meanwhile."""
    limit, amount, clients, calls = 1000, 10, 20, 10

    async def client_takes(store: RedisStore) -> int:
        results = await asyncio.gather(*(store.take("t", None, limit, amount)
                                         for _ in range(calls)))
        await store.close()
        return sum(r is None for r in results)

    async def scenario() -> int:
        stores = [RedisStore(REDIS_URL, prefix, 30.0) for _ in range(clients)]
        return sum(await asyncio.gather(*(client_takes(s) for s in stores)))

    started = time.monotonic()
    granted = run(scenario())
    elapsed = time.monotonic() - started
    refilled = limit * elapsed / 60
    assert limit // amount <= granted <= (limit + refilled) // amount, (granted, elapsed)
    # never below zero: no grant took tokens another had already taken
    left = saved_level(connect(), prefix, "t", "tokens")
    assert left is not None and left >= 0


def test_the_requests_bucket_is_atomic_too(prefix):
    limit = 50

    async def scenario() -> int:
        stores = [RedisStore(REDIS_URL, prefix, 30.0) for _ in range(10)]
        results = await asyncio.gather(*(s.take("t", limit, None, 0) for s in stores
                                         for _ in range(10)))
        for s in stores:
            await s.close()
        return sum(r is None for r in results)

    started = time.monotonic()
    granted = run(scenario())
    refilled = limit * (time.monotonic() - started) / 60
    assert limit <= granted <= limit + refilled

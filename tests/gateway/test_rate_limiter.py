"""The limiter around a store: reservations settled once to what the request used, and the
fail-open / fail-closed decision while Redis is unreachable (a port nothing listens on), counted
and logged once per outage."""
from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.process import free_port
from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.rate_limits.limiter import RateLimiter, build_limiter
from baton.services.gateway.rate_limits.memory import MemoryStore
from baton.services.gateway.rate_limits.redis_store import RedisStore
from baton.services.gateway.rate_limits.store import RateLimited
from tests.redis_store import REDIS_URL, connect, prefix, saved_level  # noqa: F401

LOGGER = "baton.services.gateway.rate_limits.limiter"


def errors(metrics: GatewayMetrics, decision: str) -> float:
    return metrics.rate_limit_store_errors.labels(decision)._value.get()


def dead_store() -> RedisStore:
    return RedisStore(f"redis://127.0.0.1:{free_port()}/0", "baton-test:", 2.0)


def test_settles_once_to_what_was_used(prefix):
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> None:
        limiter = RateLimiter(RedisStore(REDIS_URL, prefix, 5.0), metrics, describe="test")
        reservation = await limiter.admit("t", None, 1000, 600)
        assert metrics.reserved_tokens._value.get() == 600
        reservation.settle(100)
        reservation.settle(0)  # a second path ending the request: ignored
        await limiter.close()  # waits for the settlement on its way

    asyncio.run(scenario())
    assert metrics.reserved_tokens._value.get() == 0
    # 1000 - 600 + 500 given back: about 900 (the write's own refill on top, capped at 1000)
    assert 900 <= saved_level(connect(), prefix, "t", "tokens") <= 1000


def test_a_request_that_used_more_than_it_reserved_is_charged_the_rest():
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> BaseException | None:
        limiter = RateLimiter(MemoryStore(), metrics)
        (await limiter.admit("t", None, 600, 100)).settle(600)
        await limiter.close()
        try:
            await limiter.admit("t", None, 600, 100)
        except RateLimited as e:
            return e
        return None

    refused = asyncio.run(scenario())
    assert refused is not None and refused.status == 429


def test_fail_open_admits_while_redis_is_down_and_logs_the_outage_once(caplog):
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> None:
        limiter = RateLimiter(dead_store(), metrics, fail_open=True, describe="dead")
        for _ in range(5):
            reservation = await limiter.admit("t", 10, 1000, 100)
            assert not reservation.charged
            reservation.settle(10)  # nothing to give back to a store that took nothing
        await limiter.close()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        asyncio.run(scenario())
    assert errors(metrics, "admitted") == 5 and errors(metrics, "settlement_lost") == 0
    assert metrics.rate_limit_store_up._value.get() == 0
    outages = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outages) == 1 and "failing open" in outages[0].getMessage()


def test_fail_closed_refuses_with_503_while_redis_is_down(caplog):
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> list[RateLimited]:
        limiter = RateLimiter(dead_store(), metrics, fail_open=False, describe="dead")
        refusals = []
        for _ in range(3):
            with pytest.raises(RateLimited) as refused:
                await limiter.admit("t", None, 1000, 100)
            refusals.append(refused.value)
        # a tenant without limits does not need the store
        (await limiter.admit("unlimited", None, None, 100)).settle(100)
        await limiter.close()
        return refusals

    with caplog.at_level(logging.INFO, logger=LOGGER):
        refusals = asyncio.run(scenario())
    assert {(e.status, e.code) for e in refusals} == {(503, "rate_limit_store_unavailable")}
    assert all(e.retry_after_s > 0 for e in refusals)
    assert errors(metrics, "refused") == 3
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_the_outage_ends_when_the_store_answers_again(caplog, prefix):
    """A store that fails once (a Redis restart) and answers afterwards: one outage, logged as
    started and as over, and the gauge back to 1."""
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> None:
        store = RedisStore(REDIS_URL, prefix, 5.0)
        # no pause after the error: the test need not wait it out
        limiter = RateLimiter(store, metrics, fail_open=True, describe="flaky",
                              pause_after_error_s=0.0)
        real_take = store.take
        failures = iter([ConnectionError("connection reset")])

        async def take(*args: object) -> object:
            for failure in failures:
                raise failure
            return await real_take(*args)

        store.take = take  # type: ignore[method-assign]
        assert not (await limiter.admit("t", None, 1000, 1)).charged
        assert (await limiter.admit("t", None, 1000, 1)).charged
        await limiter.close()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unavailable" in m for m in messages) == 1
    assert sum("is back after" in m for m in messages) == 1
    assert metrics.rate_limit_store_up._value.get() == 1


def test_the_store_is_left_alone_for_the_configured_time_after_an_error(monkeypatch):
    """BATON_RATE_LIMIT_STORE_RETRY_AFTER_S: within it, requests are decided without calling the
    store, and a gateway failing closed tells clients to come back after it."""
    monkeypatch.setenv("BATON_RATE_LIMIT_STORE_RETRY_AFTER_S", "600")
    config = GatewayConfig(rate_limit_store=f"redis://127.0.0.1:{free_port()}/0",
                           rate_limit_fail="closed")
    metrics = GatewayMetrics(CollectorRegistry())

    async def scenario() -> tuple[list[RateLimited], int]:
        limiter = build_limiter(config, metrics)
        calls = 0
        real_take = limiter.store.take

        async def take(*args: object) -> object:
            nonlocal calls
            calls += 1
            return await real_take(*args)

        limiter.store.take = take  # type: ignore[method-assign]
        refusals = []
        for _ in range(3):
            with pytest.raises(RateLimited) as refused:
                await limiter.admit("t", None, 1000, 100)
            refusals.append(refused.value)
        await limiter.close()
        return refusals, calls

    refusals, calls = asyncio.run(scenario())
    assert calls == 1  # the first refusal found the store down; the others did not ask it
    assert [e.retry_after_s for e in refusals] == [600.0] * 3
    assert errors(metrics, "refused") == 3

"""Admission and settlement against a bucket store, and what happens while the store is down.

A shared store can fail (Redis restarting, a network partition). Failing open admits every request
unlimited while it is down, keeping the service up; failing closed refuses them with 503, keeping
the limits. Either way each decision is counted (baton_gateway_rate_limit_store_errors_total) and
the outage is logged once when it starts and once when it ends. After an error the store is left
alone for a while (--rate-limit-store-retry-after-s), so an unreachable host does not add its
timeout to every request."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

from redis.exceptions import RedisError

from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.rate_limits.memory import MemoryStore
from baton.services.gateway.rate_limits.redis_store import RedisStore
from baton.services.gateway.rate_limits.store import BucketStore, RateLimited

log = logging.getLogger(__name__)
# What a store may raise when it cannot answer (the in-process one never does).
STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
T = TypeVar("T")


class Reservation:
    """The tokens an admitted request holds until it ends; settle() once it has, with what it
    used. Only the first call counts, so every path that ends a request may call it."""

    def __init__(self, limiter: RateLimiter, tenant: str, tpm: int | None, tokens: int,
                 charged: bool) -> None:
        self.limiter, self.tenant, self.tpm, self.tokens = limiter, tenant, tpm, tokens
        self.charged = charged  # False when admitted without the store (failing open)
        self.settled = False

    def settle(self, used: int) -> None:
        if self.settled:
            return
        self.settled = True
        self.limiter.metrics.reserved_tokens.dec(self.tokens)
        if self.charged and self.tpm is not None and used != self.tokens:
            self.limiter.adjust_later(self.tenant, self.tpm, self.tokens - used)


class RateLimiter:
    def __init__(self, store: BucketStore, metrics: GatewayMetrics, fail_open: bool = True,
                 describe: str = "in-process", pause_after_error_s: float = 1.0) -> None:
        self.store, self.metrics, self.fail_open = store, metrics, fail_open
        self.describe, self.pause_after_error_s = describe, pause_after_error_s
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._pending: set[asyncio.Task] = set()
        metrics.rate_limit_store_up.set(1)

    async def admit(self, tenant: str, rpm: int | None, tpm: int | None,
                    tokens: int) -> Reservation:
        """Reserves one request and `tokens`, or raises RateLimited (429 with how long to wait;
        503 when the store is down and the gateway fails closed)."""
        charged = rpm is not None or tpm is not None
        if charged:
            try:
                denial = await self._call(self.store.take(tenant, rpm, tpm, tokens))
            except STORE_ERRORS as e:
                self._failed(e, "admitted" if self.fail_open else "refused")
                if not self.fail_open:
                    raise RateLimited("the rate-limit store is unavailable; retry shortly",
                                      self.pause_after_error_s, 503,
                                      "rate_limit_store_unavailable") from None
                charged = False
            else:
                if denial is not None:
                    raise denial.error()
        self.metrics.reserved_tokens.inc(tokens)
        return Reservation(self, tenant, tpm, tokens, charged)

    def adjust_later(self, tenant: str, tpm: int, tokens: int) -> None:
        """Settles in the background: the request that ended has nobody left to wait for it."""
        task = asyncio.ensure_future(self._adjust(tenant, tpm, tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _adjust(self, tenant: str, tpm: int, tokens: int) -> None:
        try:
            await self._call(self.store.adjust(tenant, tpm, tokens))
        except STORE_ERRORS as e:
            # the tenant keeps the difference charged until its bucket refills (a minute at most)
            self._failed(e, "settlement_lost")

    async def _call(self, work: Coroutine[Any, Any, T]) -> T:
        if self._down_since is not None and time.monotonic() < self._retry_at:
            work.close()
            raise ConnectionError("not retried yet after the last error")
        result = await work
        if self._down_since is not None:
            log.warning("rate-limit store %s is back after %.1fs", self.describe,
                        time.monotonic() - self._down_since)
            self._down_since = None
            self.metrics.rate_limit_store_up.set(1)
        return result

    def _failed(self, error: BaseException, decision: str) -> None:
        self.metrics.rate_limit_store_errors.labels(decision).inc()
        self._retry_at = time.monotonic() + self.pause_after_error_s
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.metrics.rate_limit_store_up.set(0)
            log.error("rate-limit store %s is unavailable (%s: %s); failing %s until it is back",
                      self.describe, type(error).__name__, error,
                      "open (requests admitted unlimited)" if self.fail_open else
                      "closed (requests refused with 503)")

    async def close(self) -> None:
        """Waits for the settlements still on their way, then closes the store."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=5)
        await self.store.close()


def build_limiter(config: GatewayConfig, metrics: GatewayMetrics) -> RateLimiter:
    """The store the configuration names: Redis for --rate-limit-store, else this process."""
    if config.rate_limit_store is None:
        return RateLimiter(MemoryStore(), metrics)
    where = urlsplit(config.rate_limit_store)
    # logged: the host and database, never the password the URL may hold
    describe = f"{where.scheme}://{where.hostname or ''}{f':{where.port}' if where.port else ''}" \
               f"{where.path}"
    store = RedisStore(config.rate_limit_store, config.rate_limit_key_prefix,
                       config.rate_limit_store_timeout_s)
    return RateLimiter(store, metrics, config.rate_limit_fail == "open", describe,
                       config.rate_limit_store_retry_after_s)

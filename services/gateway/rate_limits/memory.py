"""The buckets of this process alone: the default, right for a single gateway replica."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from baton.services.gateway.rate_limits.store import Denial


@dataclass
class Bucket:
    per_minute: float
    level: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.level = self.per_minute

    def refill(self, per_minute: float) -> None:
        # the limit may have changed since (an API-keys reload): the new one holds from now
        self.per_minute = per_minute
        now = time.monotonic()
        self.level = min(per_minute, self.level + (now - self.stamp) * per_minute / 60.0)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (0: now); amounts over a minute's worth never
        are."""
        if amount > self.per_minute:
            return float("inf")
        return max(0.0, (amount - self.level) * 60.0 / self.per_minute)


class MemoryStore:
    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def _bucket(self, tenant: str, what: str, per_minute: int) -> Bucket:
        bucket = self._buckets.setdefault((tenant, what), Bucket(per_minute))
        bucket.refill(per_minute)
        return bucket

    async def take(self, tenant: str, rpm: int | None, tpm: int | None,
                   tokens: int) -> Denial | None:
        checks = [(what, self._bucket(tenant, what, limit), amount, limit)
                  for what, limit, amount in (("requests", rpm, 1), ("tokens", tpm, tokens))
                  if limit is not None]
        for what, bucket, amount, limit in checks:
            wait = bucket.wait_for(amount)
            if wait > 0:
                return Denial(what, amount, limit, wait)
        for _, bucket, amount, _ in checks:
            bucket.level -= amount
        return None

    async def adjust(self, tenant: str, tpm: int, tokens: int) -> None:
        bucket = self._bucket(tenant, "tokens", tpm)
        bucket.level = min(bucket.per_minute, bucket.level + tokens)

    async def close(self) -> None:
        pass

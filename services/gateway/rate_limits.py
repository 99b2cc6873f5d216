"""Per-tenant requests-per-minute and tokens-per-minute limits, as token buckets refilled
continuously.

Tokens are charged up front (prompt plus max_tokens, the most the request can cost) and what it did
not use is refunded when it ends, so a burst of long answers cannot overrun the limit while they are
still streaming.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


class RateLimited(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Bucket:
    per_minute: float
    level: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.level = self.per_minute

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.per_minute, self.level + (now - self.stamp) * self.per_minute / 60.0)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (0: now); amounts over a minute's worth never are."""
        self._refill()
        if amount > self.per_minute:
            return float("inf")
        return max(0.0, (amount - self.level) * 60.0 / self.per_minute)

    def take(self, amount: float) -> None:
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self._refill()
        self.level = min(self.per_minute, self.level + amount)


class RateLimiter:
    def __init__(self) -> None:
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    def admit(self, tenant: str, rpm: int | None, tpm: int | None, tokens: int) -> None:
        """Charges one request and `tokens`, or raises RateLimited with how long to wait."""
        checks = []
        if rpm is not None:
            checks.append(("requests", self._requests.setdefault(tenant, Bucket(rpm)), 1, rpm))
        if tpm is not None:
            checks.append(("tokens", self._tokens.setdefault(tenant, Bucket(tpm)), tokens, tpm))
        for what, bucket, amount, limit in checks:
            wait = bucket.wait_for(amount)
            if wait == float("inf"):
                raise RateLimited(
                    f"this request needs {amount} {what} but the limit is {limit} per minute", 60.0)
            if wait > 0:
                raise RateLimited(
                    f"rate limit of {limit} {what} per minute reached; retry in {wait:.1f}s", wait)
        for _, bucket, amount, _ in checks:
            bucket.take(amount)

    def refund(self, tenant: str, tokens: int) -> None:
        bucket = self._tokens.get(tenant)
        if bucket is not None and tokens > 0:
            bucket.give_back(tokens)

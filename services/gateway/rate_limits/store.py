"""What a bucket store answers, and the error a request gets when it is refused."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RateLimited(Exception):
    """A refusal: 429 when a limit is reached, 503 when the shared store is down and the gateway
    fails closed."""

    def __init__(self, message: str, retry_after_s: float, status: int = 429,
                 code: str = "rate_limit_exceeded") -> None:
        super().__init__(message)
        self.retry_after_s, self.status, self.code = retry_after_s, status, code


@dataclass(frozen=True)
class Denial:
    """Which bucket refused (`what`: requests or tokens), for how much, and how long until it
    has that much (inf: never, the amount is over a minute's worth)."""
    what: str
    amount: int
    limit: int
    wait_s: float

    def error(self) -> RateLimited:
        if self.wait_s == float("inf"):
            return RateLimited(f"this request needs {self.amount} {self.what} but the limit is "
                               f"{self.limit} per minute", 60.0)
        return RateLimited(f"rate limit of {self.limit} {self.what} per minute reached; retry in "
                           f"{self.wait_s:.1f}s", self.wait_s)


class BucketStore(Protocol):
    """A tenant's two buckets (requests, tokens), each holding at most a minute's worth and
    refilled continuously. A limit of None is no bucket."""

    async def take(self, tenant: str, rpm: int | None, tpm: int | None,
                   tokens: int) -> Denial | None:
        """Takes one request and `tokens` from the buckets, both or neither; None when taken."""
        ...

    async def adjust(self, tenant: str, tpm: int, tokens: int) -> None:
        """Puts `tokens` back into the tokens bucket (up to its limit); a negative amount takes
        them out, below zero if need be (a debt later requests wait for)."""
        ...

    async def close(self) -> None:
        ...

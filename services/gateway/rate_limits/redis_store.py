"""The buckets in Redis, shared by every gateway replica that names the same store.

Each operation is one Lua script, which Redis runs atomically: a read-then-write from the gateway
would let two replicas both see the same tokens free and both take them. The scripts read the time
from Redis itself (TIME), so the replicas' clocks do not have to agree. A bucket's hash expires a
minute after its last change, when it would be full again anyway."""
from __future__ import annotations

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from baton.services.gateway.rate_limits.store import Denial

# Shared by both scripts: now in ms, and a bucket's level refilled to now (full when absent).
_LEVEL = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function level(key, limit)
  local saved = redis.call('HMGET', key, 'level', 'stamp')
  if not saved[1] then return limit end
  return math.min(limit, tonumber(saved[1]) + (now - tonumber(saved[2])) * limit / 60000)
end
local function save(key, value)
  redis.call('HSET', key, 'level', string.format('%.17g', value), 'stamp', now)
  redis.call('PEXPIRE', key, 61000)
end
"""
# KEYS: requests bucket, tokens bucket. ARGV: requests per minute, tokens per minute (0: no
# limit), tokens. Returns {0, 0} when taken, else {which bucket (1, 2), ms to wait (-1: never)}.
TAKE = _LEVEL + """
local limits = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local amounts = {1, tonumber(ARGV[3])}
local levels = {}
for i = 1, 2 do
  if limits[i] > 0 then
    if amounts[i] > limits[i] then return {i, -1} end
    levels[i] = level(KEYS[i], limits[i])
    if levels[i] < amounts[i] then
      return {i, math.ceil((amounts[i] - levels[i]) * 60000 / limits[i])}
    end
  end
end
for i = 1, 2 do
  if limits[i] > 0 then save(KEYS[i], levels[i] - amounts[i]) end
end
return {0, 0}
"""
# KEYS: tokens bucket. ARGV: tokens per minute, tokens to put back (negative: to take).
ADJUST = _LEVEL + """
local limit = tonumber(ARGV[1])
save(KEYS[1], math.min(limit, level(KEYS[1], limit) + tonumber(ARGV[2])))
return 0
"""


class RedisStore:
    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        # No retries: while Redis is down a request should get the fail-open/closed answer at
        # once, not after a client-side backoff.
        self.redis = Redis.from_url(url, socket_timeout=timeout_s,
                                    socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
        self.prefix = prefix
        self._take = self.redis.register_script(TAKE)
        self._adjust = self.redis.register_script(ADJUST)

    def key(self, tenant: str, what: str) -> str:
        # the tenant in braces: a Redis Cluster keeps both of its buckets in one slot, which a
        # script touching both needs
        return f"{self.prefix}{{{tenant}}}:{what}"

    async def take(self, tenant: str, rpm: int | None, tpm: int | None,
                   tokens: int) -> Denial | None:
        which, wait_ms = await self._take(
            keys=[self.key(tenant, "requests"), self.key(tenant, "tokens")],
            args=[rpm or 0, tpm or 0, tokens])
        if which == 0:
            return None
        what, amount, limit = ("requests", 1, rpm) if which == 1 else ("tokens", tokens, tpm)
        assert limit is not None  # the script only refuses by a bucket it has
        return Denial(what, amount, limit, float("inf") if wait_ms < 0 else wait_ms / 1000.0)

    async def adjust(self, tenant: str, tpm: int, tokens: int) -> None:
        await self._adjust(keys=[self.key(tenant, "tokens")], args=[tpm, tokens])

    async def close(self) -> None:
        await self.redis.aclose()

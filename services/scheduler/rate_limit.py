"""A token bucket per (cluster, kind) in Redis for disruptive tasks (docs/reliability.md
§Rate limits).

Kubernetes evicts at most 0.1 nodes a second; here each disruptive task takes a token, tokens
come back at `rate_per_s` up to `burst`, and a task that finds none waits in the queue. The
whole read-refill-take is one Lua script, so schedulers sharing a bucket never both spend its
last token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from common.clock import EpochClock
from common.errors import INFRASTRUCTURE_ERRORS
from services.shared.redis_client import Keys, text

# KEYS[1] bucket hash {tokens, at}; ARGV[1] rate per s, ARGV[2] burst, ARGV[3] now (epoch s),
# ARGV[4] TTL (ms). Returns {1 taken | 0 empty, tokens left as text}.
# The bucket's time never goes back: a scheduler whose clock lags cannot mint tokens, it only
# sees none come back until its clock catches up. A missing bucket is a full one, so the key
# may expire once it would have refilled anyway.
TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
local at = tonumber(redis.call('HGET', KEYS[1], 'at'))
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate)
  at = now
end
local taken = 0
if tokens >= 1 - 1e-9 then
  tokens = math.max(0, tokens - 1)
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'at', string.format('%.17g', at))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {taken, string.format('%.17g', tokens)}
"""


@dataclass(frozen=True)
class RateDecision:
    """Whether a token was taken, and when the next one is due if not."""

    allowed: bool
    tokens: float
    retry_after_s: float = 0.0


class RateLimitUnreadable(Exception):
    """The bucket could not be read or changed: Redis did not answer."""


class RateLimiter:
    """Token buckets per (cluster, kind), shared by every scheduler through Redis."""

    def __init__(self, redis: Redis, keys: Keys, rate_per_s: float, burst: int,
                 clock: EpochClock = time.time) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least 1")
        self.redis = redis
        self.keys = keys
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self._take = redis.register_script(TAKE)
        # After this long unused a bucket is full again, so Redis may forget it.
        self._ttl_ms = math.ceil(burst / rate_per_s * 1000) + 1000

    async def take(self, cluster: str, kind: str) -> RateDecision:
        """Take one token of (cluster, kind) if there is one; raises RateLimitUnreadable."""
        try:
            taken, left = await self._take(
                keys=[self.keys.rate_bucket(cluster, kind)],
                args=[repr(self.rate_per_s), self.burst, repr(self.clock()), self._ttl_ms],
            )
        except INFRASTRUCTURE_ERRORS as err:
            raise RateLimitUnreadable(repr(err)) from err
        tokens = float(text(left))
        if int(taken) == 1:
            return RateDecision(allowed=True, tokens=tokens)
        return RateDecision(allowed=False, tokens=tokens,
                            retry_after_s=(1.0 - tokens) / self.rate_per_s)

    async def tokens(self, cluster: str, kind: str) -> float:
        """The tokens the bucket of (cluster, kind) holds now, as `take` would find it,
        taking none (for the rate-limit gauge); raises RateLimitUnreadable."""
        try:
            tokens, at = await self.redis.hmget(self.keys.rate_bucket(cluster, kind),
                                                ["tokens", "at"])
        except INFRASTRUCTURE_ERRORS as err:
            raise RateLimitUnreadable(repr(err)) from err
        if tokens is None or at is None:
            return float(self.burst)  # a missing bucket is a full one
        refilled = max(0.0, self.clock() - float(text(at))) * self.rate_per_s
        return min(float(self.burst), float(text(tokens)) + refilled)

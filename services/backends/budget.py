"""An explicit rate budget: a token bucket the caller owns and passes to a backend.

A cluster's eviction rate is a budget ClusterWarden sets per cluster and can report, not a
limit hidden in a client library: every eviction takes a token, and the bucket refills at
`rate_per_s` up to `burst`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from common.clock import EpochClock


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int, *, clock: EpochClock = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a budget needs a positive rate and a burst of at least 1")
        self.rate_per_s, self.burst = rate_per_s, burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = asyncio.Lock()
        self.taken = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now

    def wait_s(self) -> float:
        """How long until a token is there (0: one is there now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate_per_s

    async def acquire(self) -> None:
        """Takes one token, waiting for the refill if the bucket is empty."""
        async with self._lock:
            while (wait := self.wait_s()) > 0:
                await self._sleep(wait)
            self._tokens -= 1
            self.taken += 1

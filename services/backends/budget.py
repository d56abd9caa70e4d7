"""An explicit rate budget: a token bucket the caller owns and passes to a backend.

A cluster's eviction rate is a budget ClusterWarden sets per cluster and can report, not a
limit hidden in a client library: every eviction takes a token, and the bucket refills at
`rate_per_s` up to `burst`.

The bucket is kept as a schedule of grant slots (the generic cell rate algorithm): each
grant moves the schedule on by one interval (1 / rate) from the slot it was due at, not from
the moment its waiter woke up. A refill counted from the wake-up loses every late wake-up of
a busy process for good (with a burst of 1 the bucket cannot save it), and so evicted below
the budget: 3.8 evictions a second of a 5/s budget in the remediation bench. Counted from
the slot, a late grant is made up by the next one, and over any span the grants stay within
`burst` plus `rate_per_s` times the span (by their slots).
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
        self._interval = 1.0 / rate_per_s
        # When the bucket is full again if nothing more is taken (the theoretical arrival
        # time); a grant is due once it is within `burst` intervals of it.
        self._full_at = clock()
        self._lock = asyncio.Lock()
        self.taken = 0

    def _due_at(self) -> float:
        return self._full_at - self.burst * self._interval + self._interval

    def wait_s(self) -> float:
        """How long until a token is there (0: one is there now)."""
        return max(0.0, self._due_at() - self._clock())

    async def acquire(self) -> None:
        """Takes one token, waiting for its slot if the bucket is empty."""
        asked_at = self._clock()
        async with self._lock:
            while (wait := self.wait_s()) > 0:
                await self._sleep(wait)
            # From the slot the grant was due at, however late this waiter woke; from when
            # it asked if the bucket had refilled by then (it sat idle).
            self._full_at = max(self._full_at, asked_at) + self._interval
            self.taken += 1

"""Refused authentications, audited at a bounded rate.

Each 401 used to be one entry in the store's audit chain, so a flood of guessed tokens grew
the chain without bound and held its head row's lock for every guess. Now the refusals are
counted in Redis per window (WINDOW_S) and per (source address, reason): the first refusal of
a pair in a window is audited, the rest of that window only counted (the count's key expires
with the window after next, and `warden.api.auth_refusals` counts them all). At most
MAX_AUDITED_PAIRS pairs are audited per window, and one more entry says the cap was reached:
a window adds at most MAX_AUDITED_PAIRS + 1 entries whatever the flood, spread over however
many addresses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from redis.asyncio import Redis

from services.api.auth import Refusal
from services.shared.redis_client import Keys

log = logging.getLogger("clusterwarden.api")

WINDOW_S = 60
MAX_AUDITED_PAIRS = 20

# KEYS[1] the pair's count, KEYS[2] the window's count of pairs; ARGV[1] their TTL (s).
# Returns {the pair's count, the window's pairs (0 if this was not the pair's first)}.
COUNT_REFUSAL = """
local n = redis.call('INCR', KEYS[1])
if n > 1 then return {n, 0} end
redis.call('EXPIRE', KEYS[1], ARGV[1])
local pairs = redis.call('INCR', KEYS[2])
if pairs == 1 then redis.call('EXPIRE', KEYS[2], ARGV[1]) end
return {n, pairs}
"""

Decision = Literal["audit", "audit_cap", "count"]


@dataclass(frozen=True)
class RefusalWindow:
    """The window a refusal falls in: its index and when it began."""

    index: int
    start: datetime


def window_of(now: datetime, window_s: int = WINDOW_S) -> RefusalWindow:
    index = int(now.timestamp()) // window_s
    return RefusalWindow(index, datetime.fromtimestamp(index * window_s, UTC))


def decide(pair_count: int, pairs_in_window: int, cap: int = MAX_AUDITED_PAIRS) -> Decision:
    """Whether one refusal gets its own audit entry, the cap's entry, or only its count."""
    if pair_count != 1:
        return "count"
    if pairs_in_window <= cap:
        return "audit"
    return "audit_cap" if pairs_in_window == cap + 1 else "count"


class RefusalCounter:
    """The Redis side: counts a refusal and says what to audit of it."""

    def __init__(self, redis: Redis, keys: Keys, window_s: int = WINDOW_S) -> None:
        self.keys = keys
        self.window_s = window_s
        self._count = redis.register_script(COUNT_REFUSAL)

    async def count(self, window: RefusalWindow, source: str, refusal: Refusal) -> Decision:
        pair, pairs = await self._count(
            keys=[self.keys.api_refusals(window.index, source, refusal.reason),
                  self.keys.api_refusal_sources(window.index)],
            args=[2 * self.window_s])
        return decide(int(pair), int(pairs))

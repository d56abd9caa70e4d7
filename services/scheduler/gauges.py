"""The scheduler's limits as gauges (common/metrics.py), read from Redis every few seconds:
its breakers by state, each pool's offline budget (capacity and in use) and the tokens of
each rate-limited kind. Read, not recorded where they change: every scheduler instance
shares them through Redis, and a level is what a dashboard shows.

Breakers are counted by kind, scope and state, never named: a node-scoped breaker's name
holds its node, and a series per node would grow with the fleet.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Final

from redis.asyncio import Redis

from common.clock import EpochClock
from common.metrics import (
    BREAKERS,
    BUDGET_CAPACITY,
    BUDGET_IN_FLIGHT,
    RATE_LIMIT_TOKENS,
    Instruments,
    instruments,
)
from services.scheduler.breaker import kind_of, scope_of
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.rate_limit import RateLimiter, RateLimitUnreadable
from services.scheduler.safety import budget_capacity
from services.scheduler.safety_store import SafetyStore, SafetyUnreadable
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.scheduler.gauges")

BREAKER_STATES: Final = ("CLOSED", "OPEN", "HALF_OPEN", "unreadable")

BreakerKey = tuple[str, str, str]  # (cluster, kind, scope)


class LimitGauges:
    """Samples breakers, budgets and rate limits into their gauges."""

    def __init__(self, settings: SchedulerSettings, redis: Redis, keys: Keys,
                 breakers: BreakerStore, safety: SafetyStore, rate_limiter: RateLimiter,
                 clock: EpochClock = time.time, recorded: Instruments | None = None) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = keys
        self.breakers = breakers
        self.safety = safety
        self.rate_limiter = rate_limiter
        self.clock = clock
        recorded = recorded or instruments()
        self._breakers = recorded.gauge(BREAKERS)
        self._capacity = recorded.gauge(BUDGET_CAPACITY)
        self._in_flight = recorded.gauge(BUDGET_IN_FLIGHT)
        self._tokens = recorded.gauge(RATE_LIMIT_TOKENS)
        self._breaker_keys: set[BreakerKey] = set()

    async def sample(self) -> None:
        clusters = sorted(text(c) for c in await self.redis.smembers(self.keys.clusters()))
        await self._sample_breakers()
        for cluster in clusters:
            await self._sample_budgets(cluster)
            await self._sample_tokens(cluster)

    async def _sample_breakers(self) -> None:
        counts: Counter[tuple[BreakerKey, str]] = Counter()
        for cluster, name, state in await self.breakers.states():
            key = (cluster, kind_of(name), str(scope_of(name)))
            counts[key, state.status if state is not None else "unreadable"] += 1
            self._breaker_keys.add(key)
        # Every state of every breaker group seen: a breaker that closed again leaves its
        # OPEN count at 0, not at its last value.
        for cluster, kind, scope in self._breaker_keys:
            for status in BREAKER_STATES:
                self._breakers.set(counts[(cluster, kind, scope), status],
                                   {"cluster": cluster, "kind": kind, "scope": scope,
                                    "state": status})

    async def _sample_budgets(self, cluster: str) -> None:
        now = self.clock()
        for pool in sorted(text(p) for p in await self.redis.smembers(self.keys.pools(cluster))):
            where = {"cluster": cluster, "pool": pool}
            try:
                health = await self.safety.load_health(cluster, pool)
                in_flight = await self.safety.in_flight(cluster, pool, now)
            except SafetyUnreadable as err:
                log.debug("budget of %s/%s unreadable: %s", cluster, pool, err)
                continue
            self._in_flight.set(in_flight, where)
            if health is not None:  # no health: no budget at all (budgeted tasks wait)
                self._capacity.set(max(0, budget_capacity(
                    health, self.settings.offline_budget_fraction)), where)

    async def _sample_tokens(self, cluster: str) -> None:
        for kind in self.settings.rate_limited_kinds:
            try:
                tokens = await self.rate_limiter.tokens(cluster, kind)
            except RateLimitUnreadable as err:
                log.debug("rate limit %s/%s unreadable: %s", cluster, kind, err)
                continue
            self._tokens.set(tokens, {"cluster": cluster, "kind": kind})

"""Counters that never go back (services/shared/counters.py) on a real redis-server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from common.clock import epoch_ms
from services.shared.counters import RisingCounters
from services.shared.redis_client import Keys

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


async def test_numbers_taken_together_count_one_by_one_from_the_clock(
    redis: Redis, keys: Keys
) -> None:
    counters, key = RisingCounters(redis), keys.epoch()
    first = await counters.next(key, T0)
    assert first == epoch_ms(T0)
    assert [await counters.next(key, T0) for _ in range(3)] == [first + 1, first + 2,
                                                                 first + 3]


async def test_a_counter_that_lost_its_recent_state_gives_nothing_it_gave_before(
    redis: Redis, keys: Keys
) -> None:
    counters, key = RisingCounters(redis), keys.command_seq("c1", "n1")
    before = await counters.next(key, T0)
    await redis.set(key, 7)  # Redis restored from a snapshot taken long ago
    after = await counters.next(key, T0 + timedelta(milliseconds=1))
    assert after > before


async def test_a_counter_ahead_of_the_clock_keeps_counting(redis: Redis, keys: Keys) -> None:
    counters, key = RisingCounters(redis), keys.epoch()
    ahead = epoch_ms(T0) + 10_000
    await redis.set(key, ahead)
    assert await counters.next(key, T0) == ahead + 1

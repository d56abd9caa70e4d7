"""The token bucket on the real redis-server, with a clock the test moves by hand."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from services.scheduler.rate_limit import RateLimiter
from services.shared.redis_client import Keys, connect_redis
from tests.service.scheduler.helpers import Clock


def limiter(redis: Redis, keys: Keys, clock: Clock, rate: float = 0.1,
            burst: int = 2) -> RateLimiter:
    return RateLimiter(redis, keys, rate, burst, clock=clock)


async def takes(bucket: RateLimiter, n: int, kind: str = "offline") -> list[bool]:
    return [(await bucket.take("c1", kind)).allowed for _ in range(n)]


async def test_a_full_bucket_lets_a_burst_through_then_refuses(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    bucket = limiter(redis, keys, clock)
    assert await takes(bucket, 3) == [True, True, False]
    refused = await bucket.take("c1", "offline")
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(10.0)


async def test_tokens_come_back_at_the_rate(redis: Redis, keys: Keys, clock: Clock) -> None:
    bucket = limiter(redis, keys, clock)
    await takes(bucket, 2)
    clock.advance(5.0)
    half = await bucket.take("c1", "offline")
    assert not half.allowed
    assert half.tokens == pytest.approx(0.5)
    assert half.retry_after_s == pytest.approx(5.0)
    clock.advance(5.0)
    assert await takes(bucket, 2) == [True, False]
    clock.advance(25.0)  # 2.5 tokens' worth, but the bucket holds at most the burst
    assert await takes(bucket, 3) == [True, True, False]


async def test_a_lagging_clock_mints_no_tokens(redis: Redis, keys: Keys, clock: Clock) -> None:
    bucket = limiter(redis, keys, clock)
    await takes(bucket, 2)
    clock.advance(-3_600.0)  # another scheduler, an hour behind
    assert await takes(bucket, 1) == [False]
    clock.advance(3_600.0 + 10.0)
    assert await takes(bucket, 2) == [True, False]


async def test_each_cluster_and_kind_has_its_own_bucket(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    bucket = limiter(redis, keys, clock, burst=1)
    assert await takes(bucket, 2, "offline") == [True, False]
    assert await takes(bucket, 1, "scale_in") == [True]
    assert (await bucket.take("c2", "offline")).allowed


async def test_schedulers_sharing_a_bucket_never_overspend_it(
        redis_url: str, redis: Redis, keys: Keys, clock: Clock) -> None:
    clients = [connect_redis(redis_url) for _ in range(4)]
    try:
        buckets = [limiter(client, keys, clock) for client in clients]
        decisions = await asyncio.gather(*(b.take("c1", "offline") for b in buckets * 5))
        assert sum(d.allowed for d in decisions) == 2
    finally:
        for client in clients:
            await client.aclose()


async def test_an_idle_bucket_expires_once_it_would_be_full(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    bucket = limiter(redis, keys, clock)
    await takes(bucket, 1)
    ttl_ms = await redis.pttl(keys.rate_bucket("c1", "offline"))
    assert 20_000 < ttl_ms <= 21_000  # burst / rate = 20 s, plus a second


def test_a_bucket_needs_a_positive_rate_and_a_burst(redis: Redis, keys: Keys,
                                                    clock: Clock) -> None:
    with pytest.raises(ValueError, match="positive rate"):
        limiter(redis, keys, clock, rate=0.0)
    with pytest.raises(ValueError, match="burst"):
        limiter(redis, keys, clock, burst=0)

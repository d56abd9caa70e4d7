"""The offline budget's atomic admission on the real redis-server: the check and the count
are one step, so schedulers racing for a pool's last place cannot both win."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from services.scheduler.safety_store import SafetyStore
from services.shared.redis_client import Keys, connect_redis
from tests.service.scheduler.helpers import task

NOW = 1_800_000_000.0
LAPSES = NOW + 3_600.0


async def test_two_schedulers_admitting_at_once_on_a_budget_of_one_admit_exactly_one(
        redis_url: str, redis: Redis, keys: Keys) -> None:
    clients = [connect_redis(redis_url), connect_redis(redis_url)]
    try:
        stores = [SafetyStore(client, keys, 600) for client in clients]
        for round_ in range(20):
            pool = f"pool-{round_}"
            first, second = task("node-1", pool=pool), task("node-2", pool=pool)
            admissions = await asyncio.gather(
                stores[0].admit_in_flight(first, 1, LAPSES, NOW),
                stores[1].admit_in_flight(second, 1, LAPSES, NOW))
            assert sorted(a.outcome for a in admissions) == ["counted", "refused"]
            assert await stores[0].in_flight("local", pool, NOW) == 1
    finally:
        for client in clients:
            await client.aclose()


async def test_a_task_already_counted_keeps_its_place(redis: Redis, keys: Keys) -> None:
    store = SafetyStore(redis, keys, 600)
    held = task("node-1")
    assert (await store.admit_in_flight(held, 1, LAPSES, NOW)).outcome == "counted"
    # Redispatched after a crash: admitted again, without a second place.
    again = await store.admit_in_flight(held, 1, LAPSES + 100, NOW)
    assert (again.outcome, again.in_flight) == ("already_counted", 1)
    assert await redis.zscore(store.in_flight_key("local", "default"), str(held.task_id)) == LAPSES


async def test_a_finished_or_released_task_gives_its_place_back(redis: Redis,
                                                                keys: Keys) -> None:
    store = SafetyStore(redis, keys, 600)
    first, second = task("node-1"), task("node-2")
    await store.admit_in_flight(first, 1, LAPSES, NOW)
    assert not (await store.admit_in_flight(second, 1, LAPSES, NOW)).admitted
    assert await store.finish(str(first.task_id), NOW)
    assert not await store.finish(str(first.task_id), NOW)  # a replayed final event
    assert (await store.admit_in_flight(second, 1, LAPSES, NOW)).outcome == "counted"
    await store.release_in_flight(second)
    assert await store.in_flight("local", "default", NOW) == 0
    assert not await store.finish(str(second.task_id), NOW)  # its index went with it


async def test_lapsed_entries_no_longer_hold_the_budget(redis: Redis, keys: Keys) -> None:
    store = SafetyStore(redis, keys, 600)
    await store.admit_in_flight(task("node-1"), 1, NOW + 10, NOW)
    assert not (await store.admit_in_flight(task("node-2"), 1, LAPSES, NOW + 5)).admitted
    assert (await store.admit_in_flight(task("node-2"), 1, LAPSES, NOW + 10)).admitted


async def test_a_capacity_of_zero_or_less_admits_nothing(redis: Redis, keys: Keys) -> None:
    store = SafetyStore(redis, keys, 600)
    for capacity in (0, -2):
        admission = await store.admit_in_flight(task("node-1"), capacity, LAPSES, NOW)
        assert (admission.outcome, admission.in_flight) == ("refused", 0)

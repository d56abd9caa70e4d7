"""Task locks on the real Redis: taken all or none, freed only by the task that owns them."""

from __future__ import annotations

from uuid import uuid4

from redis.asyncio import Redis

from services.shared.locks import Locks
from services.shared.redis_client import Keys


async def test_locks_are_taken_again_unless_another_task_holds_one(redis: Redis,
                                                                   keys: Keys) -> None:
    locks = Locks(redis, keys)
    mine, other = str(uuid4()), str(uuid4())
    assert await locks.acquire(mine, ["node.n1", "job.j1"], 60) is None
    assert await redis.get(keys.lock("node.n1")) == mine.encode()
    assert await locks.acquire(mine, ["node.n1"], 60) is None  # refresh, still mine
    assert await locks.acquire(other, ["job.j2", "node.n1"], 60) == ("node.n1", mine)
    assert await redis.get(keys.lock("job.j2")) is None  # all or nothing


async def test_a_task_frees_only_the_locks_it_still_owns(redis: Redis, keys: Keys) -> None:
    locks = Locks(redis, keys)
    mine, other = str(uuid4()), str(uuid4())
    assert await locks.acquire(mine, ["node.n1", "job.j1"], 60) is None
    assert await locks.acquire(other, ["node.n2"], 60) is None
    await locks.release(mine, ["node.n1", "node.n2"])
    assert await redis.get(keys.lock("node.n1")) is None
    assert await redis.get(keys.lock("node.n2")) == other.encode()  # not mine: kept
    assert await redis.get(keys.lock("job.j1")) == mine.encode()  # not named: kept
    await locks.release_all(mine, ["job.j1", "node.n2"])
    assert await redis.get(keys.lock("job.j1")) is None
    assert await redis.get(keys.lock("node.n2")) == other.encode()

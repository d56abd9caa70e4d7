"""The scheduler's record of the tasks it has queued is bounded on the real redis-server: a
redelivered task is still not queued twice, and ids older than a week are trimmed."""

from __future__ import annotations

from redis.asyncio import Redis

from services.scheduler.queue import KNOWN_FOR_MS, TaskQueue
from services.shared.redis_client import Keys
from tests.service.scheduler.helpers import task


async def test_a_known_task_is_not_queued_twice_and_old_ids_are_trimmed(
        redis: Redis, keys: Keys) -> None:
    queue = TaskQueue(redis, keys)
    first = task("node-001")
    assert await queue.enqueue(first, 1, 60.0)
    assert not await queue.enqueue(first, 1, 60.0)  # redelivered
    # An id known since long before the week: trimmed by the next enqueue.
    now_s, _ = await redis.time()
    await redis.zadd(keys.queue_known(), {"ancient": now_s * 1000 - KNOWN_FOR_MS - 60_000})
    assert await queue.enqueue(task("node-002"), 1, 60.0)
    assert await redis.zscore(keys.queue_known(), "ancient") is None
    assert await redis.zcard(keys.queue_known()) == 2
    assert not await queue.enqueue(first, 1, 60.0)

"""A Redis that answers but refuses, on a real redis-server of the test's own: out of memory
(maxmemory), a replica after a failover (REPLICAOF), failing snapshots (MISCONF) and a user
without the permission (ACL). The scheduler's task handler fails on each; the dead-letter
middleware neither dead-letters the message nor lets it be committed; delivered again once
Redis accepts writes, the task is queued. And a stalled Redis (SIGSTOP) fails a call within
5 s, the write sent once, never resent."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from faststream._internal.context.repository import ContextRepo
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.deadletter import DeadLetterPolicy, classify
from common.errors import REDIS_REFUSALS
from schemas.topics import Topic
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.handlers import Scheduler
from services.scheduler.queue import TaskQueue
from services.scheduler.rate_limit import RateLimiter
from services.scheduler.safety_store import SafetyStore
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, connect_redis
from tests.ports import free_port
from tests.service.scheduler.helpers import Clock, RecordingBus, task
from tests.waiting import eventually

Toggle = Callable[[Redis, Path], Awaitable[None]]
USER, PASSWORD = "warden-scheduler", "scheduler-secret"


async def out_of_memory(admin: Redis, _: Path) -> None:
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", 1)


async def memory_again(admin: Redis, _: Path) -> None:
    await admin.config_set("maxmemory", 0)


async def replica(admin: Redis, _: Path) -> None:
    # A replica of a primary that is gone: what a failover leaves a client pointed at.
    await admin.replicaof("127.0.0.1", free_port())


async def primary_again(admin: Redis, _: Path) -> None:
    await admin.replicaof("NO", "ONE")


async def snapshots_failing(admin: Redis, data: Path) -> None:
    await admin.config_set("save", "3600 1")
    # A folder where the snapshot goes: it cannot be written, and Redis stops taking writes.
    (data / "dump.rdb").mkdir()
    await admin.bgsave()
    failed: bool = await eventually(lambda: _status_is(admin, "err"), "the snapshot failing")
    assert failed


async def snapshots_again(admin: Redis, data: Path) -> None:
    (data / "dump.rdb").rmdir()
    await admin.bgsave()
    saved: bool = await eventually(lambda: _status_is(admin, "ok"), "the snapshot succeeding")
    assert saved


async def _status_is(admin: Redis, wanted: str) -> bool:
    info = await admin.info("persistence")
    return info["rdb_last_bgsave_status"] == wanted and not info["rdb_bgsave_in_progress"]


async def no_write_permission(admin: Redis, _: Path) -> None:
    await admin.acl_setuser(USER, enabled=True, categories=["-@write"])


async def write_permission_again(admin: Redis, _: Path) -> None:
    await admin.acl_setuser(USER, enabled=True, categories=["+@all"])


REFUSALS: dict[str, tuple[Toggle, Toggle]] = {
    "oom": (out_of_memory, memory_again),
    "readonly": (replica, primary_again),
    "misconf": (snapshots_failing, snapshots_again),
    "noperm": (no_write_permission, write_permission_again),
}


def scheduler(redis: Redis, keys: Keys, clock: Clock) -> Scheduler:
    config = SchedulerSettings(rate_burst=100)
    return Scheduler(config, TaskQueue(redis, keys), RecordingBus(),
                     BreakerStore(redis, keys, config.breaker_config, clock=clock),
                     SafetyStore(redis, keys, config.pool_health_ttl_s),
                     RateLimiter(redis, keys, config.rate_per_s, config.rate_burst, clock=clock),
                     clock=clock.utc)


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_refusing_redis_neither_dead_letters_nor_commits_the_task_and_it_is_queued_later(
        refusal: str, private_redis: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    url, _ = private_redis
    refuse, accept = REFUSALS[refusal]
    admin = connect_redis(url)
    await admin.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"],
                            channels=["*"], categories=["+@all"])
    client = connect_redis(url.replace("redis://", f"redis://{USER}:{PASSWORD}@"))
    keys = Keys("refusals")
    s = scheduler(client, keys, Clock())
    assert isinstance(s.bus, RecordingBus)
    dead_letters: list[str] = []

    async def publish(topic: str, key: bytes | None, value: bytes,
                      headers: dict[str, str]) -> None:
        dead_letters.append(topic)

    policy = DeadLetterPolicy("scheduler", publish, wait_delay_s=0.0)
    offline = task("node-007")
    try:
        await refuse(admin, tmp_path / "private-redis")
        with pytest.raises(REDIS_REFUSALS) as refused:
            await s.on_task(offline)
        assert classify(refused.value)[:2] == ("wait", "infrastructure_unavailable")
        # What the subscriber's middleware does with it: not handled, so the exception stands
        # and the message is not committed; and nothing dead-lettered.
        middleware = policy(None, context=ContextRepo())
        handled = await middleware.after_processed(type(refused.value), refused.value, None)
        assert handled is False
        assert dead_letters == []
        assert s.bus.on(Topic.OPS_TASK_EVENTS) == []

        await accept(admin, tmp_path / "private-redis")
        await s.on_task(offline)  # the message delivered again
        assert await s.queue.depth() == 1
        assert len(s.bus.on(Topic.OPS_TASK_EVENTS)) == 1
        assert dead_letters == []
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_stalled_redis_fails_a_call_within_the_bound_and_the_write_is_not_resent(
        private_redis: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, server = private_redis
    client = connect_redis(url)
    await client.set("sent", 0)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError) as stalled:
            await client.incr("sent")
        elapsed = time.monotonic() - started
        assert elapsed <= 5.0
        assert classify(stalled.value)[0] == "wait"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    # The INCR was in the server's socket all along and runs now, once: a client that resent
    # the timed-out write would have counted it again for every resend.
    applied: bool = await eventually(lambda: _value_is(client, b"1"), "the stalled INCR applied")
    assert applied
    await asyncio.sleep(0.2)
    assert await client.get("sent") == b"1"
    await client.aclose()


async def _value_is(client: Redis, wanted: bytes) -> bool:
    return await client.get("sent") == wanted

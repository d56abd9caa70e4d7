"""Task locks and the concurrency semaphore, in one home: their names, how long they live,
how they are taken and freed.

A lock is a Redis string at `Keys.lock(<name>)` holding the id of the task that owns it; the
scheduler dispatches a task only while it holds every name in its `mutex_keys`.

- Names: `node.<cluster>.<node>`, `job.<cluster>.<job>` and `pool.<cluster>.<pool>`
  (templates write them from the need's values, and every template lock names its cluster;
  the centre's child tasks use `node_lock` and `job_lock`). Every name is scoped by its
  cluster: two clusters may both have a `node-001` or a `node-001.train`, and they never
  share a lock.
- Lifetime: `lock_ttl_s`, a task's worst-case run plus a margin, so the locks of a task
  nobody finishes lapse on their own.
- Taken: by the scheduler's claim, atomically with taking the task from its queue
  (`services/scheduler/queue.py`); again by the executor when an operator resumes, retries or
  jumps a task (`Locks.acquire`: all or none).
- Freed: by the executor when a task ends (`Locks.release`), by the scheduler when it puts a
  claimed task back (`Locks.release_all`); only the locks the task still owns.

A template's `concurrency` (at most N of its tasks run at once per cluster) is not a lock but
a counting semaphore (`Semaphore`): a sorted set per template and cluster at
`Keys.semaphore(<template>, <cluster>)` whose members are the ids of the tasks holding a
place, scored by when the place lapses (the task's lock TTL). Any N tasks may hold it,
whatever their targets. The scheduler takes a place when it admits a task (with its relations,
`services/scheduler/relations_store.py`); the executor gives it back when the task ends, and
the scheduler again on the task's final event (both idempotent). The relations between
templates (exclusive_with, depends_on, concurrent_with) are admission rules of the
scheduler, not locks either.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.asyncio import Redis

from schemas.events.v1 import OpsTask
from services.shared.redis_client import Keys, text

# Takes every lock of a task (SET PX under its id) unless another task holds one of them;
# returns '' or the first lock held by someone else, and its owner.
ACQUIRE_LOCKS = """
for i = 1, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if owner and owner ~= ARGV[1] then return {KEYS[i], owner} end
end
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
return {}
"""

# A place in a template's semaphore: expired places (tasks whose end was never seen) are
# pruned first; a task already holding a place keeps it (a redispatch after a crash).
# KEYS[1] the semaphore; ARGV[1] task id, ARGV[2] limit, ARGV[3] now and ARGV[4] when the
# place lapses (one unit, any: the offline budget counts in seconds, the semaphore in ms).
# Returns {1 taken | 2 already held | 0 refused, places held}.
TAKE_PLACE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
local held = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {2, held} end
if held >= tonumber(ARGV[2]) then return {0, held} end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
return {1, held + 1}
"""


def take_place_call(keys: str, args: str) -> str:
    """TAKE_PLACE as a Lua expression inside another script (which must stay one atomic
    step), given its KEYS and ARGV as Lua tables, e.g. `take_place_call("{KEYS[3]}", ...)`."""
    return f"(function(KEYS, ARGV)\n{TAKE_PLACE}\nend)({keys}, {args})"

RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Puts a claimed task back: its locks go at once (other tasks may need them this tick), its
# place in the ready queue comes back later (the scheduler's `requeue`).
RELEASE_ALL = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 1
"""


def node_lock(cluster: str, node_id: str) -> str:
    """The lock of one node of a cluster: one disruptive action per node at a time."""
    return f"node.{cluster}.{node_id}"


def job_lock(cluster: str, job_id: str) -> str:
    """The lock of one job of a cluster while it moves."""
    return f"job.{cluster}.{job_id}"


def lock_ttl_s(task: OpsTask, margin_s: float) -> float:
    """How long a task's locks live if nobody releases them: its worst-case run plus a margin."""
    return sum(step.timeout_s * step.max_attempts for step in task.steps) + margin_s


class HeldLock(NamedTuple):
    """A lock another task holds: which, and whose."""

    lock: str
    owner: str


class Locks:
    """Takes and frees a task's locks in Redis; each operation is one script."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.keys = keys
        self.semaphore = Semaphore(redis, keys)
        self._acquire, self._release, self._release_all = (
            redis.register_script(script) for script in (ACQUIRE_LOCKS, RELEASE_LOCK, RELEASE_ALL))

    async def acquire(self, task_id: str, mutex_keys: list[str],
                      ttl_s: float) -> HeldLock | None:
        """Take the task's locks (again); None, or the one another task holds."""
        reply = await self._acquire(
            keys=[self.keys.lock(key) for key in mutex_keys],
            args=[task_id, int(ttl_s * 1000)],
        )
        if not reply:
            return None
        lock, owner = (_decode(v) for v in reply)
        return HeldLock(lock.removeprefix(self.keys.lock("")), owner)

    async def release(self, task_id: str, mutex_keys: list[str]) -> None:
        """Release the locks a task holds (only those it still owns), one by one."""
        for key in mutex_keys:
            await self._release(keys=[self.keys.lock(key)], args=[task_id])

    async def release_task(self, task: OpsTask) -> None:
        """A task ended: its locks and its place in its template's semaphore go."""
        await self.release(str(task.task_id), task.mutex_keys)
        await self.semaphore.release_for(task)

    async def release_all(self, task_id: str, mutex_keys: list[str]) -> None:
        """Release the locks a task still owns in one atomic step."""
        await self._release_all(keys=[self.keys.lock(k) for k in mutex_keys], args=[task_id])


def _decode(reply: Any) -> str:
    return text(reply) if isinstance(reply, bytes | str) else str(reply)


class Place(NamedTuple):
    """A semaphore's answer: whether the task holds a place now, and how many are held."""

    taken: bool
    held: int


def semaphore_lapse_ms(task: OpsTask, now_ms: int, margin_s: float) -> int:
    """When a task's place lapses if nobody gives it back: when its locks would."""
    return now_ms + int(lock_ttl_s(task, margin_s) * 1000)


class Semaphore:
    """At most `limit` tasks of a template at once per cluster (see the module docstring)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._take = redis.register_script(TAKE_PLACE)

    async def take(self, template: str, cluster: str, task_id: str, limit: int,
                   now_ms: int, lapses_at_ms: int) -> Place:
        """Take a place for the task unless `limit` places are held by others."""
        outcome, held = await self._take(
            keys=[self.keys.semaphore(template, cluster)],
            args=[task_id, limit, now_ms, lapses_at_ms])
        return Place(int(outcome) != 0, int(held))

    async def release(self, template: str, cluster: str, task_id: str) -> None:
        """Give the task's place back (a no-op if it holds none)."""
        await self.redis.zrem(self.keys.semaphore(template, cluster), task_id)

    async def release_for(self, task: OpsTask) -> None:
        """Give back the place of a task that ended, if its template limits it."""
        if task.relations is not None:
            await self.release(task.relations.template, task.cluster_id, str(task.task_id))

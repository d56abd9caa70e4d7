"""Task locks, in one home: their names, how long they live, how they are taken and freed.

A lock is a Redis string at `Keys.lock(<name>)` holding the id of the task that owns it; the
scheduler dispatches a task only while it holds every name in its `mutex_keys`.

- Names: `node.<cluster>.<node>`, `job.<cluster>.<job>` and `pool.<cluster>.<pool>`
  (templates write them from the need's values, and every template lock names its cluster;
  the centre's child tasks use `node_lock` and `job_lock`), and the keys that carry a
  template's execution count and its relations to other templates (below). Every name is
  scoped by its cluster: two clusters may both have a `node-001` or a `node-001.train`, and
  they never share a lock.
- Lifetime: `lock_ttl_s`, a task's worst-case run plus a margin, so the locks of a task
  nobody finishes lapse on their own.
- Taken: by the scheduler's claim, atomically with taking the task from its queue
  (`services/scheduler/queue.py`); again by the executor when an operator resumes, retries or
  jumps a task (`Locks.acquire`: all or none).
- Freed: by the executor when a task ends (`Locks.release`), by the scheduler when it puts a
  claimed task back (`Locks.release_all`); only the locks the task still owns.

Limits between templates: the scheduler only knows exclusive locks, so every limit between
tasks is written as shared keys:

- execution_count N: a task takes one of N slot keys `tpl.<name>.<cluster>[.<slot>]`, the
  slot chosen by a stable hash of its target, so at most N tasks of the template run at once
  per cluster. Two targets can hash to the same slot and then wait for each other: the bound
  is exact, the parallelism is not (a task never waits for a free slot other than its own).
- exclusion of templates A (N slots) and B (M slots): one key per pair of slots,
  `excl.<a>.<b>.<cluster>.<i>.<j>` (names sorted; just `excl.<a>.<b>.<cluster>` when N = M = 1).
  An A task in slot i takes every key of row i, a B task in slot j every key of column j:
  each A task shares a key with each B task, and two A tasks share none of these keys, so an
  exclusion never limits A against A (its own execution count does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256
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

    async def release_all(self, task_id: str, mutex_keys: list[str]) -> None:
        """Release the locks a task still owns in one atomic step."""
        await self._release_all(keys=[self.keys.lock(k) for k in mutex_keys], args=[task_id])


def _decode(reply: Any) -> str:
    return text(reply) if isinstance(reply, bytes | str) else str(reply)


@dataclass(frozen=True)
class Exclusion:
    """Two templates whose tasks never run at the same time in one cluster."""

    first: str  # the names in sorted order, so both sides compute the same keys
    second: str
    first_slots: int
    second_slots: int

    @classmethod
    def between(cls, a: str, a_slots: int, b: str, b_slots: int) -> Exclusion:
        if b < a:
            a, a_slots, b, b_slots = b, b_slots, a, a_slots
        return cls(first=a, second=b, first_slots=a_slots, second_slots=b_slots)

    def other_slots(self, name: str) -> int:
        """How many keys a task of `name` takes for this exclusion."""
        return self.second_slots if name == self.first else self.first_slots

    def keys(self, name: str, cluster: str, own_slot: int) -> list[str]:
        """The keys a task of template `name` in slot `own_slot` takes."""
        base = f"excl.{self.first}.{self.second}.{cluster}"
        if self.first_slots == self.second_slots == 1:
            return [base]
        if name == self.first:
            cells = [(own_slot, j) for j in range(self.second_slots)]
        else:
            cells = [(i, own_slot) for i in range(self.first_slots)]
        return [f"{base}.{i}.{j}" for i, j in cells]


def slot_of(target: str, slots: int) -> int:
    """The execution slot of a target: stable across processes (unlike `hash`)."""
    if slots == 1:
        return 0
    return int.from_bytes(sha256(target.encode()).digest()[:8], "big") % slots


def execution_key(name: str, cluster: str, slots: int, slot: int) -> str:
    """The slot key that bounds how many tasks of a template run at once in a cluster."""
    return f"tpl.{name}.{cluster}" if slots == 1 else f"tpl.{name}.{cluster}.{slot}"

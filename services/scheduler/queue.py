"""A Redis priority queue with leases: a claimed task whose dispatcher dies is requeued.

Claiming takes the task's per-target locks in the same atomic step, so a task is only ever
dispatched while it holds every lock it names (one disruptive action per node).

Beside each task its items hash keeps the trace context it was queued in (field
`<task id>:trace`, common/tracing.py): the dispatcher loop that claims it has no message to
take a context from, and its dispatch belongs to the trace of the need the task came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from redis.asyncio import Redis

from common.tracing import current_trace
from schemas.events.v1 import OpsTask
from services.shared.redis_client import Keys, text
from services.shared.vouchers import Dispatches

# A task is known for KNOWN_FOR_MS after it was first queued, by Redis's own clock (the
# task's occurred_at is the sender's, and a forged one far ahead would trim every entry): a
# redelivered task arrives within hours, not weeks, and without the trim the ids of every
# task ever queued would pile up.
KNOWN_FOR_MS = 7 * 86_400_000
ENQUEUE = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[6]))
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[3], ARGV[1] .. ':trace', ARGV[7]) end
return 1
"""

# Lock keys are derived from the task's mutex list (stored beside it), so they cannot all be
# declared in KEYS; this needs a single Redis (or hash-tagged keys in a cluster).
CLAIM = """
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1)
for _, id in ipairs(ids) do
  local mutex = redis.call('HGET', KEYS[4], id) or ''
  local free = true
  for key in string.gmatch(mutex, '%S+') do
    local owner = redis.call('GET', ARGV[4] .. key)
    if owner and owner ~= id then free = false break end
  end
  if free then
    local ttl = redis.call('HGET', KEYS[5], id) or ARGV[3]
    for key in string.gmatch(mutex, '%S+') do
      redis.call('SET', ARGV[4] .. key, id, 'PX', ttl)
    end
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], tonumber(ARGV[1]) + tonumber(ARGV[2]), id)
    return {id, redis.call('HGET', KEYS[3], id), redis.call('HGET', KEYS[3], id .. ':trace') or ''}
  end
end
return false
"""

REAP = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[3], id) or 0, id)
end
return #ids
"""

def trace_field(task_id: str) -> str:
    """The items hash's field that keeps a queued task's trace context."""
    return f"{task_id}:trace"


@dataclass(frozen=True)
class Claimed:
    """A task taken from the queue under a lease, its locks held."""

    task: OpsTask
    trace_context: str = ""  # packed: the context it was queued in ('' if none was kept)


class TaskQueue:
    """The scheduler's queue; every operation is one atomic script."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._enqueue = redis.register_script(ENQUEUE)
        self._claim = redis.register_script(CLAIM)
        self._reap = redis.register_script(REAP)
        self._dispatches = Dispatches(redis, keys)

    def _mutex_hash(self) -> str:
        return self.keys.queue_items() + ":mutex"

    def _ttl_hash(self) -> str:
        return self.keys.queue_items() + ":lockttl"

    async def enqueue(self, task: OpsTask, score: int, lock_ttl_s: float) -> bool:
        """Queue a task once; a redelivered task is not queued again. True if new."""
        new = await self._enqueue(
            keys=[self.keys.queue_known(), self.keys.queue_ready(), self.keys.queue_items(),
                  self.keys.queue_scores(), self._mutex_hash(), self._ttl_hash()],
            args=[str(task.task_id), score, task.model_dump_json(), " ".join(task.mutex_keys),
                  int(lock_ttl_s * 1000), KNOWN_FOR_MS, current_trace()],
        )
        return bool(new)

    async def claim(self, now_ms: int, lease_ms: int, scan_limit: int) -> Claimed | None:
        """The most urgent queued task whose locks are free, now leased and locked."""
        row = await self._claim(
            keys=[self.keys.queue_ready(), self.keys.queue_inflight(), self.keys.queue_items(),
                  self._mutex_hash(), self._ttl_hash()],
            args=[now_ms, lease_ms, 3_600_000, self.keys.lock(""), scan_limit],
        )
        if not row:
            return None
        return Claimed(OpsTask.model_validate_json(row[1]),
                       text(row[2]) if len(row) > 2 else "")

    async def ack(self, task_id: str) -> None:
        """The task was dispatched: forget it (its locks stay until the executor releases them)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.keys.queue_inflight(), task_id)
            pipe.hdel(self.keys.queue_items(), task_id, trace_field(task_id))
            pipe.hdel(self.keys.queue_scores(), task_id)
            pipe.hdel(self._mutex_hash(), task_id)
            pipe.hdel(self._ttl_hash(), task_id)
            await pipe.execute()

    async def reap(self, now_ms: int) -> int:
        """Requeue tasks whose lease ran out (their dispatcher died)."""
        return int(await self._reap(
            keys=[self.keys.queue_inflight(), self.keys.queue_ready(), self.keys.queue_scores()],
            args=[now_ms],
        ))

    async def dispatch_epoch(self, task: OpsTask, ttl_s: float, now: datetime) -> int:
        """A fencing token larger than any before it, recorded as `task`'s dispatch for the
        executor to check (services/shared/vouchers.py), for as long as its locks live."""
        return await self._dispatches.issue(task, ttl_s, now)

    async def depth(self) -> int:
        return int(await self.redis.zcard(self.keys.queue_ready()))

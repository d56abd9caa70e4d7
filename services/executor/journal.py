"""The durable step journal: one Redis hash per task, changed only by compare-and-set scripts.

Each step goes scheduled -> started (with its command id) -> completed | failed. After a
crash the executor reads the journal and carries on from it; a result or a timeout for a
command that is no longer the current one changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from schemas.events.v1 import OpsTask
from services.shared.redis_client import Keys, members, text

# Creates the workflow, or takes it over under a newer epoch. Returns 'new', 'takeover'
# or 'stale' (an epoch no newer than the one already running).
START = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and tonumber(epoch) >= tonumber(ARGV[1]) then return 'stale' end
if epoch then redis.call('HSET', KEYS[1], 'epoch', ARGV[1]) return 'takeover' end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'task', ARGV[2], 'state', 'running',
  'step', 0, 'attempt', 0, 'step_state', 'scheduled', 'command_id', '', 'outputs', '{}')
return 'new'
"""

# Marks step ARGV[1] attempt ARGV[2] started with command ARGV[3], if the workflow is at it.
STEP_STARTED = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'step')) ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'attempt', ARGV[2], 'step_state', 'started', 'command_id', ARGV[3],
  'deadline_ms', ARGV[4])
redis.call('SET', KEYS[2], ARGV[5], 'EX', 86400)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
return 1
"""

# Ends the current step if command ARGV[1] is still the current one. ARGV[2] is the step's
# outcome ('completed' or 'failed'); ARGV[3] the outputs (JSON) to merge under the step;
# ARGV[4] the next step index, or '' to leave the step pointer alone.
STEP_ENDED = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'command_id') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'step_state') ~= 'started' then return 0 end
redis.call('HSET', KEYS[1], 'step_state', ARGV[2])
if ARGV[2] == 'completed' then
  local outputs = cjson.decode(redis.call('HGET', KEYS[1], 'outputs'))
  outputs[redis.call('HGET', KEYS[1], 'step')] = cjson.decode(ARGV[3])
  redis.call('HSET', KEYS[1], 'outputs', cjson.encode(outputs))
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'step', ARGV[4], 'attempt', 0, 'step_state', 'scheduled')
end
redis.call('ZREM', KEYS[2], ARGV[5])
return 1
"""

FINISH = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], 604800)
return 1
"""


@dataclass(frozen=True)
class Workflow:
    """A task's journal as read from Redis."""

    task: OpsTask
    epoch: int
    state: str
    step: int
    attempt: int
    step_state: str
    command_id: str
    outputs: dict[str, Any]


class Journal:
    """The executor's Redis adapter."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._start = redis.register_script(START)
        self._started = redis.register_script(STEP_STARTED)
        self._ended = redis.register_script(STEP_ENDED)
        self._finish = redis.register_script(FINISH)

    async def start(self, task: OpsTask, epoch: int) -> str:
        result = await self._start(
            keys=[self.keys.workflow(str(task.task_id))], args=[epoch, task.model_dump_json()]
        )
        return result.decode() if isinstance(result, bytes) else str(result)

    async def load(self, task_id: str) -> Workflow | None:
        raw = await self.redis.hgetall(self.keys.workflow(task_id))
        if not raw or b"task" not in raw:
            return None
        row = {text(k): text(v) for k, v in raw.items()}
        return Workflow(
            task=OpsTask.model_validate_json(row["task"]),
            epoch=int(row["epoch"]),
            state=row["state"],
            step=int(row["step"]),
            attempt=int(row["attempt"]),
            step_state=row["step_state"],
            command_id=row["command_id"],
            outputs=json.loads(row["outputs"]),
        )

    async def step_started(self, task_id: str, step: int, attempt: int, command_id: str,
                           deadline_ms: int) -> bool:
        return bool(await self._started(
            keys=[self.keys.workflow(task_id), self.keys.command_index(command_id),
                  self.keys.workflow_deadlines()],
            args=[step, attempt, command_id, deadline_ms, task_id],
        ))

    async def step_ended(self, task_id: str, command_id: str, outcome: str,
                         outputs: dict[str, Any], next_step: int | None) -> bool:
        return bool(await self._ended(
            keys=[self.keys.workflow(task_id), self.keys.workflow_deadlines()],
            args=[command_id, outcome, json.dumps(outputs),
                  "" if next_step is None else next_step, task_id],
        ))

    async def finish(self, task_id: str, state: str, reason: str) -> bool:
        return bool(await self._finish(
            keys=[self.keys.workflow(task_id), self.keys.workflow_deadlines()],
            args=[state, reason, task_id],
        ))

    async def task_of_command(self, command_id: str) -> str | None:
        value = await self.redis.get(self.keys.command_index(command_id))
        return text(value) if value else None

    async def overdue(self, now_ms: int) -> list[str]:
        return members(
            await self.redis.zrangebyscore(self.keys.workflow_deadlines(), "-inf", now_ms)
        )

    async def next_command_seq(self, node_id: str) -> int:
        """Per-node command sequence: agents refuse a command not newer than the last."""
        return int(await self.redis.incr(self.keys.command_seq(node_id)))

"""The durable step journal: one Redis hash per task, changed only by compare-and-set scripts.

Each step goes scheduled -> started (with its command id) -> completed | skipped | failed.
After a crash the executor reads the journal and carries on from it; a result or a timeout
for a command that is no longer the current one changes nothing. No state lives in the
process: every decision is made from a fresh read and applied by one atomic script.

Where a running workflow waits:
* a started step is in the deadlines ZSET (its deadline);
* a scheduled step is in the deadlines ZSET too, at "start it by", so a step whose starter
  crashed is started by the sweep;
* a step waiting for its retry is in the retries ZSET (when to retry);
* a paused or final workflow is in neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, cast

from redis.asyncio import Redis

from schemas.envelope import short_text
from schemas.events.v1 import OpsTask, OutputValue, StepState, TaskState
from services.shared.redis_client import Keys, members, text

FINAL_TTL_S = 604_800  # a finished workflow is kept a week (operators may retry it)
INDEX_TTL_S = 86_400  # command id -> task, for answers that arrive late

# Every script starts with this: reads a field of the workflow with a default, so a
# workflow journaled by an older executor (without the newer fields) is still read.
_FIELD = """
local function field(name, default)
  local value = redis.call('HGET', KEYS[1], name)
  if value then return value end
  return default
end
local function bump() redis.call('HINCRBY', KEYS[1], 'version', 1) end
"""

# Creates the workflow (applying a control that arrived before it), or takes it over under a
# newer epoch. Returns {'new'|'paused'|'terminated'|'takeover'|'stale', actor, reason, id}.
START = _FIELD + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and tonumber(epoch) >= tonumber(ARGV[1]) then return {'stale'} end
if epoch then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
  bump()
  return {'takeover'}
end
local pending = redis.call('HGET', KEYS[2], 'action')
local actor = redis.call('HGET', KEYS[2], 'actor') or ''
local reason = redis.call('HGET', KEYS[2], 'reason') or ''
local control = redis.call('HGET', KEYS[2], 'control_id') or ''
local state = 'running'
if pending == 'pause' then state = 'paused' elseif pending == 'terminate' then
  state = 'terminated' end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'task', ARGV[2], 'state', state, 'step', 0,
  'attempt', 0, 'run', 0, 'step_state', 'scheduled', 'command_id', '', 'deadline_ms', 0,
  'outputs', '{}', 'version', 1, 'pause', '', 'queries', 0, 'resent', 0, 'query_id', '',
  'waiting', 0, 'waiting_outputs', '{}', 'children_cmd', '', 'reason', '', 'cause', '')
redis.call('DEL', KEYS[2])
if state == 'running' then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4]) end
if state == 'terminated' then
  redis.call('HSET', KEYS[1], 'cause', 'terminated', 'reason', reason)
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
if state == 'running' then return {'new', actor, reason, control} end
return {state, actor, reason, control}
"""

# Marks step ARGV[1] attempt ARGV[2] of run ARGV[6] started with command ARGV[3], if the
# workflow is exactly there and nobody started it yet.
STEP_STARTED = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[1]) then return 0 end
if tonumber(field('attempt', '0')) ~= tonumber(ARGV[2]) then return 0 end
if tonumber(field('run', '0')) ~= tonumber(ARGV[6]) then return 0 end
if field('step_state', '') ~= 'scheduled' then return 0 end
redis.call('HSET', KEYS[1], 'step_state', 'started', 'command_id', ARGV[3],
  'deadline_ms', ARGV[4], 'queries', 0, 'resent', 0, 'query_id', '', 'waiting', 0,
  'waiting_outputs', '{}')
bump()
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[7])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
redis.call('ZREM', KEYS[4], ARGV[5])
return 1
"""

# Ends the current step: ARGV[5] is 'completed', 'skipped' (a scheduled step whose guard
# does not hold) or 'failed' (with a retry due at ARGV[9] epoch ms, or '' for no retry).
# Then moves to the next step, pauses there if a pause was requested, or finishes the task.
# Returns {'next'|'retry'|'paused'|'succeeded'|'failed'|'stale', pause request}.
STEP_ENDED = _FIELD + """
local wf = KEYS[1]
if field('state', '') ~= 'running' then return {'stale'} end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[2]) then return {'stale'} end
if tonumber(field('attempt', '0')) ~= tonumber(ARGV[3]) then return {'stale'} end
if tonumber(field('run', '0')) ~= tonumber(ARGV[4]) then return {'stale'} end
local outcome = ARGV[5]
if outcome == 'skipped' then
  if field('step_state', '') ~= 'scheduled' then return {'stale'} end
else
  if field('step_state', '') ~= 'started' then return {'stale'} end
  if field('command_id', '') ~= ARGV[1] then return {'stale'} end
end
bump()
redis.call('ZREM', KEYS[2], ARGV[7])
redis.call('ZREM', KEYS[3], ARGV[7])
if outcome ~= 'failed' then
  local outputs = cjson.decode(field('outputs', '{}'))
  outputs[ARGV[2]] = cjson.decode(ARGV[6])
  redis.call('HSET', wf, 'outputs', cjson.encode(outputs))
  local nxt = tonumber(ARGV[2]) + 1
  if nxt >= tonumber(ARGV[13]) then
    redis.call('HSET', wf, 'step_state', outcome, 'state', 'succeeded', 'reason', ARGV[10],
      'cause', '', 'pause', '')
    redis.call('EXPIRE', wf, ARGV[12])
    return {'succeeded'}
  end
  redis.call('HSET', wf, 'step', nxt, 'attempt', 0, 'step_state', 'scheduled',
    'command_id', '', 'query_id', '', 'waiting', 0)
else
  if ARGV[9] == '' then
    redis.call('HSET', wf, 'step_state', 'failed', 'state', 'failed', 'reason', ARGV[10],
      'cause', ARGV[11], 'pause', '', 'query_id', '')
    redis.call('EXPIRE', wf, ARGV[12])
    return {'failed'}
  end
  redis.call('HSET', wf, 'attempt', tonumber(ARGV[3]) + 1, 'step_state', 'scheduled',
    'command_id', '', 'query_id', '', 'waiting', 0)
end
local pause = field('pause', '')
if pause ~= '' then
  redis.call('HSET', wf, 'state', 'paused', 'pause', '')
  return {'paused', pause}
end
if outcome == 'failed' then
  redis.call('ZADD', KEYS[3], ARGV[9], ARGV[7])
  return {'retry'}
end
redis.call('ZADD', KEYS[2], ARGV[8], ARGV[7])
return {'next'}
"""

# Recovery of a started step past its deadline: counts one more status query (or centre
# re-run), records the query's id (ARGV[2], '' for a re-run) and a new deadline, and indexes
# the query's command id to the task with a marker (ARGV[6], '' for none).
RECOVERY = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if field('step_state', '') ~= 'started' then return 0 end
if field('command_id', '') ~= ARGV[1] then return 0 end
if field('query_id', '') ~= '' then return 0 end
if tonumber(field('queries', '0')) >= tonumber(ARGV[4]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'queries', 1)
redis.call('HSET', KEYS[1], 'query_id', ARGV[2], 'deadline_ms', ARGV[3])
bump()
if ARGV[6] ~= '' then redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[7]) end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[5])
return 1
"""

# A status query (ARGV[2]) was answered "not in the journal" (ARGV[4] = '1': the command is
# sent again, once) or "in progress": the deadline moves and the query is no longer
# outstanding. With ARGV[2] '' (no query outstanding) it only moves the deadline.
QUERY_ANSWERED = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if field('step_state', '') ~= 'started' then return 0 end
if field('command_id', '') ~= ARGV[1] then return 0 end
if field('query_id', '') ~= ARGV[2] then return 0 end
if ARGV[4] == '1' then
  if tonumber(field('resent', '0')) >= 1 then return 0 end
  redis.call('HSET', KEYS[1], 'resent', 1)
end
redis.call('HSET', KEYS[1], 'query_id', '', 'deadline_ms', ARGV[3])
bump()
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
return 1
"""

# The started centre step ARGV[1] split into child tasks ARGV[4..]: records them (a re-run
# of the same command adds the same ones; a new command starts a fresh set). Returns
# {children, finished, failed} or {} if the step is no longer current.
AWAIT_CHILDREN = _FIELD + """
if field('state', '') ~= 'running' then return {} end
if field('step_state', '') ~= 'started' then return {} end
if field('command_id', '') ~= ARGV[1] then return {} end
if field('children_cmd', '') ~= ARGV[1] then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('HSET', KEYS[1], 'children_cmd', ARGV[1])
end
for i = 4, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'waiting', redis.call('SCARD', KEYS[2]),
  'waiting_outputs', ARGV[2])
bump()
local failed = 0
local outcomes = redis.call('HGETALL', KEYS[3])
for i = 2, #outcomes, 2 do if outcomes[i] ~= 'succeeded' then failed = failed + 1 end end
return {redis.call('SCARD', KEYS[2]), redis.call('HLEN', KEYS[3]), failed}
"""

# Child ARGV[1] of the parent (KEYS[1]) finished in state ARGV[2]: recorded if the parent
# still waits for it at step ARGV[3]. Returns {children, finished, failed} or {}.
CHILD_DONE = _FIELD + """
if field('state', '') ~= 'running' then return {} end
if field('step_state', '') ~= 'started' then return {} end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[3]) then return {} end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then return {} end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[4])
local failed = 0
local outcomes = redis.call('HGETALL', KEYS[3])
for i = 2, #outcomes, 2 do if outcomes[i] ~= 'succeeded' then failed = failed + 1 end end
return {redis.call('SCARD', KEYS[2]), redis.call('HLEN', KEYS[3]), failed}
"""

# An operator's transition, applied only if nothing changed since the workflow was read
# (version ARGV[1]) and this control (ARGV[3]) was not applied before. ARGV[4] holds the
# fields to set; ARGV[5] what becomes of its timers: 'keep', 'clear' (paused, final) or
# 'kick' (start the scheduled step by ARGV[6]); ARGV[7] 'persist' | 'expire' | 'keep'.
# Returns 1 applied, 0 changed meanwhile, -1 a duplicate control.
TRANSITION = _FIELD + """
if tonumber(field('version', '0')) ~= tonumber(ARGV[1]) then return 0 end
if ARGV[3] ~= '' and redis.call('SISMEMBER', KEYS[4], ARGV[3]) == 1 then return -1 end
local fields = cjson.decode(ARGV[4])
for name, value in pairs(fields) do redis.call('HSET', KEYS[1], name, value) end
bump()
if ARGV[5] == 'clear' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
elseif ARGV[5] == 'kick' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[2])
end
if ARGV[7] == 'persist' then redis.call('PERSIST', KEYS[1])
elseif ARGV[7] == 'expire' then redis.call('EXPIRE', KEYS[1], ARGV[8]) end
if ARGV[3] ~= '' then
  redis.call('SADD', KEYS[4], ARGV[3])
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
return 1
"""

# A control for a task not journaled yet: kept (ARGV[1] 'set') or withdrawn ('clear') until
# the task arrives. Returns 'exists' (the workflow arrived meanwhile), 'duplicate' or 'ok'.
PENDING_CONTROL = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 1 then return 'duplicate' end
if ARGV[1] == 'set' then
  redis.call('HSET', KEYS[2], 'action', ARGV[3], 'actor', ARGV[4], 'reason', ARGV[5],
    'control_id', ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
else
  redis.call('DEL', KEYS[2])
end
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[6])
return 'ok'
"""

QUERY_MARK = "query:"
CANCEL_MARK = "cancel:"

StepOutcome = Literal["completed", "skipped", "failed"]
Boundary = Literal["next", "retry", "paused", "succeeded", "failed", "stale"]


@dataclass(frozen=True)
class Workflow:
    """A task's journal as read from Redis."""

    task: OpsTask
    epoch: int
    state: TaskState
    step: int
    attempt: int
    step_state: StepState
    command_id: str
    outputs: dict[str, Any]
    run: int = 0
    version: int = 0
    deadline_ms: int = 0
    pause: dict[str, str] | None = None
    queries: int = 0
    resent: int = 0
    query_id: str = ""
    waiting: int = 0
    waiting_outputs: dict[str, OutputValue] | None = None
    reason: str = ""
    cause: str = ""

    @property
    def task_id(self) -> str:
        return str(self.task.task_id)


@dataclass(frozen=True)
class Ended:
    """Where a step's end left the workflow (and the pause request that stopped it)."""

    boundary: Boundary
    pause: dict[str, str] | None = None


@dataclass(frozen=True)
class ChildCounts:
    """A waiting step's children: how many, how many finished, how many of those failed."""

    children: int
    finished: int
    failed: int

    @property
    def settled(self) -> bool:
        return self.finished >= self.children


@dataclass(frozen=True)
class Pending:
    """A control kept for a task the executor has not received yet."""

    action: str
    actor: str
    reason: str


def _decode(reply: Any) -> str:
    return text(reply) if isinstance(reply, bytes | str) else str(reply)


def _counts(reply: Any) -> ChildCounts | None:
    if not reply:
        return None
    children, finished, failed = (int(v) for v in reply)
    return ChildCounts(children, finished, failed)


class Journal:
    """The executor's Redis adapter."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._start = redis.register_script(START)
        self._started = redis.register_script(STEP_STARTED)
        self._ended = redis.register_script(STEP_ENDED)
        self._recovery = redis.register_script(RECOVERY)
        self._answered = redis.register_script(QUERY_ANSWERED)
        self._await = redis.register_script(AWAIT_CHILDREN)
        self._child_done = redis.register_script(CHILD_DONE)
        self._transition = redis.register_script(TRANSITION)
        self._pending = redis.register_script(PENDING_CONTROL)

    def controls_seen(self, task_id: str) -> str:
        """SET of the operator controls already applied to a task (private to the executor):
        a redelivered control must not act twice."""
        return f"{self.keys.prefix}wf-control-seen:{task_id}"

    # -------------------------------------------------------- reading

    async def load(self, task_id: str) -> Workflow | None:
        raw = await self.redis.hgetall(self.keys.workflow(task_id))
        if not raw or b"task" not in raw:
            return None
        row = {text(k): text(v) for k, v in raw.items()}
        pause = row.get("pause", "")
        return Workflow(
            task=OpsTask.model_validate_json(row["task"]),
            epoch=int(row["epoch"]),
            state=cast(TaskState, row["state"]),
            step=int(row["step"]),
            attempt=int(row["attempt"]),
            step_state=cast(StepState, row["step_state"]),
            command_id=row["command_id"],
            outputs=json.loads(row.get("outputs") or "{}"),
            run=int(row.get("run") or 0),
            version=int(row.get("version") or 0),
            deadline_ms=int(float(row.get("deadline_ms") or 0)),
            pause=json.loads(pause) if pause else None,
            queries=int(row.get("queries") or 0),
            resent=int(row.get("resent") or 0),
            query_id=row.get("query_id", ""),
            waiting=int(row.get("waiting") or 0),
            waiting_outputs=json.loads(row.get("waiting_outputs") or "{}"),
            reason=row.get("reason", ""),
            cause=row.get("cause", ""),
        )

    async def task_of_command(self, command_id: str) -> str | None:
        """The task a command id belongs to (a status query's or a cancel's: with a mark)."""
        value = await self.redis.get(self.keys.command_index(command_id))
        return text(value) if value else None

    async def overdue(self, now_ms: int) -> list[str]:
        """Workflows whose started step is past its deadline, or whose scheduled step is late."""
        return members(
            await self.redis.zrangebyscore(self.keys.workflow_deadlines(), "-inf", now_ms)
        )

    async def open_workflows(self) -> list[str]:
        """Every workflow with a started or scheduled step (for recovery on startup)."""
        return members(await self.redis.zrange(self.keys.workflow_deadlines(), 0, -1))

    async def due_retries(self, now_ms: int) -> list[str]:
        return members(
            await self.redis.zrangebyscore(self.keys.workflow_retries(), "-inf", now_ms)
        )

    async def forget_timers(self, task_id: str) -> None:
        """Drop timers of a workflow that is no longer running (a leftover, never a change)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.keys.workflow_deadlines(), task_id)
            pipe.zrem(self.keys.workflow_retries(), task_id)
            await pipe.execute()

    async def forget_retry(self, task_id: str) -> None:
        await self.redis.zrem(self.keys.workflow_retries(), task_id)

    async def next_command_seq(self, node_id: str) -> int:
        """Per-node command sequence: agents refuse a command not newer than the last."""
        return int(await self.redis.incr(self.keys.command_seq(node_id)))

    async def open_children(self, task_id: str, step: int) -> list[str]:
        """Children of a step that have not finished yet."""
        children = {text(k) for k in await self.redis.smembers(
            self.keys.children(task_id, step))}
        done = {text(k) for k in await self.redis.hkeys(self.keys.child_outcomes(task_id, step))}
        return sorted(children - done)

    async def child_counts(self, task_id: str, step: int) -> ChildCounts:
        children = int(await self.redis.scard(self.keys.children(task_id, step)))
        outcomes = await self.redis.hgetall(self.keys.child_outcomes(task_id, step))
        failed = sum(1 for v in outcomes.values() if text(v) != "succeeded")
        return ChildCounts(children, len(outcomes), failed)

    # -------------------------------------------------------- starting and ending steps

    async def start(self, task: OpsTask, epoch: int, kick_ms: int) -> tuple[str, Pending | None]:
        """Create the workflow; the outcome, and the pending control applied at creation."""
        task_id = str(task.task_id)
        reply = await self._start(
            keys=[self.keys.workflow(task_id), self.keys.workflow_controls(task_id),
                  self.keys.workflow_deadlines()],
            args=[epoch, task.model_dump_json(), kick_ms, task_id, FINAL_TTL_S],
        )
        values = [_decode(v) for v in reply]
        outcome = values[0]
        if outcome in ("paused", "terminated"):
            return outcome, Pending(outcome, values[1], values[2])
        return outcome, None

    async def step_started(self, wf: Workflow, command_id: str, deadline_ms: int) -> bool:
        return bool(await self._started(
            keys=[self.keys.workflow(wf.task_id), self.keys.command_index(command_id),
                  self.keys.workflow_deadlines(), self.keys.workflow_retries()],
            args=[wf.step, wf.attempt, command_id, deadline_ms, wf.task_id, wf.run,
                  INDEX_TTL_S],
        ))

    async def step_ended(self, wf: Workflow, outcome: StepOutcome, *,
                         outputs: dict[str, Any] | None = None, kick_ms: int = 0,
                         retry_at_ms: int | None = None, reason: str = "",
                         cause: str = "") -> Ended:
        """End the current step (CAS on step, attempt, run and command id)."""
        reply = await self._ended(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines(),
                  self.keys.workflow_retries()],
            args=[wf.command_id, wf.step, wf.attempt, wf.run, outcome,
                  json.dumps(outputs or {}), wf.task_id, kick_ms,
                  "" if retry_at_ms is None else retry_at_ms, short_text(reason), cause,
                  FINAL_TTL_S, len(wf.task.steps)],
        )
        values = [_decode(v) for v in reply]
        boundary: Boundary = values[0]  # type: ignore[assignment]
        pause = json.loads(values[1]) if len(values) > 1 and values[1] else None
        return Ended(boundary, pause)

    # -------------------------------------------------------- recovery

    async def recovery_started(self, wf: Workflow, query_id: str, deadline_ms: int,
                               max_queries: int) -> bool:
        """Count one status query (`query_id`) or centre re-run (`query_id` '')."""
        index_key = self.keys.command_index(query_id or wf.command_id)
        return bool(await self._recovery(
            keys=[self.keys.workflow(wf.task_id), index_key, self.keys.workflow_deadlines()],
            args=[wf.command_id, query_id, deadline_ms, max_queries, wf.task_id,
                  QUERY_MARK + wf.task_id if query_id else "", INDEX_TTL_S],
        ))

    async def query_answered(self, wf: Workflow, deadline_ms: int, *, resend: bool) -> bool:
        return bool(await self._answered(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines()],
            args=[wf.command_id, wf.query_id, deadline_ms, "1" if resend else "0", wf.task_id],
        ))

    async def extend_deadline(self, wf: Workflow, deadline_ms: int) -> bool:
        """Move a started step's deadline (no status query outstanding)."""
        return bool(await self._answered(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines()],
            args=[wf.command_id, "", deadline_ms, "0", wf.task_id],
        ))

    async def index_cancel(self, cancel_id: str, task_id: str) -> None:
        await self.redis.set(self.keys.command_index(cancel_id), CANCEL_MARK + task_id,
                             ex=INDEX_TTL_S)

    # -------------------------------------------------------- children

    async def await_children(self, wf: Workflow, child_ids: list[str],
                             outputs: dict[str, OutputValue]) -> ChildCounts | None:
        return _counts(await self._await(
            keys=[self.keys.workflow(wf.task_id), self.keys.children(wf.task_id, wf.step),
                  self.keys.child_outcomes(wf.task_id, wf.step)],
            args=[wf.command_id, json.dumps(outputs), FINAL_TTL_S, *child_ids],
        ))

    async def child_done(self, parent: Workflow, child_id: str, state: str) -> ChildCounts | None:
        return _counts(await self._child_done(
            keys=[self.keys.workflow(parent.task_id),
                  self.keys.children(parent.task_id, parent.step),
                  self.keys.child_outcomes(parent.task_id, parent.step)],
            args=[child_id, state, parent.step, FINAL_TTL_S],
        ))

    # -------------------------------------------------------- operator controls

    async def transition(self, wf: Workflow, control_id: str, fields: dict[str, str], *,
                         timers: Literal["keep", "clear", "kick"] = "keep", kick_ms: int = 0,
                         ttl: Literal["keep", "persist", "expire"] = "keep") -> int:
        """Apply an operator's transition if the workflow is still as read (1, 0, -1)."""
        return int(await self._transition(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines(),
                  self.keys.workflow_retries(), self.controls_seen(wf.task_id)],
            args=[wf.version, wf.task_id, control_id, json.dumps(fields), timers, kick_ms,
                  ttl, FINAL_TTL_S],
        ))

    async def pending_control(self, task_id: str) -> Pending | None:
        raw = await self.redis.hgetall(self.keys.workflow_controls(task_id))
        if not raw:
            return None
        row = {text(k): text(v) for k, v in raw.items()}
        return Pending(row.get("action", ""), row.get("actor", ""), row.get("reason", ""))

    async def keep_pending(self, task_id: str, control_id: str, action: str | None,
                           actor: str, reason: str) -> str:
        """Keep (or with `action` None, withdraw) a control for a task not journaled yet."""
        return _decode(await self._pending(
            keys=[self.keys.workflow(task_id), self.keys.workflow_controls(task_id),
                  self.controls_seen(task_id)],
            args=["clear" if action is None else "set", control_id, action or "", actor,
                  short_text(reason), FINAL_TTL_S],
        ))

    async def control_seen(self, task_id: str, control_id: str) -> bool:
        return bool(await self.redis.sismember(
            self.controls_seen(task_id), control_id))

    async def mark_control_seen(self, task_id: str, control_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self.controls_seen(task_id), control_id)
            pipe.expire(self.controls_seen(task_id), FINAL_TTL_S)
            await pipe.execute()

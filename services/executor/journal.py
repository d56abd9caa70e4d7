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
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, cast

from redis.asyncio import Redis

from common.tracing import current_trace
from schemas.envelope import short_text
from schemas.events.v1 import OpsTask, OutputValue, StepState, TaskState
from services.executor.events import SOURCE
from services.executor.journal_scripts import (
    AWAIT_CHILDREN,
    CHILD_DONE,
    PENDING_CONTROL,
    QUERY_ANSWERED,
    RECOVERY,
    START,
    STEP_ENDED,
    STEP_STARTED,
    TRANSITION,
)
from services.shared.counters import RisingCounters
from services.shared.redis_client import Keys, members, text

FINAL_TTL_S = 604_800  # a finished workflow is kept a week (operators may retry it)
INDEX_TTL_S = 86_400  # command id -> task, for answers that arrive late

QUERY_MARK = "query:"
CANCEL_MARK = "cancel:"

StepOutcome = Literal["completed", "skipped", "failed"]
Boundary = Literal["next", "retry", "paused", "succeeded", "failed", "stale"]
StartOutcome = Literal["new", "paused", "terminated", "takeover", "stale"]
# What an operator's transition did: applied, nothing (the workflow changed since it was
# read), or nothing (the control was applied before).
Transition = Literal["applied", "changed", "duplicate"]
PendingOutcome = Literal["ok", "exists", "duplicate"]
_TRANSITIONS: dict[int, Transition] = {1: "applied", 0: "changed", -1: "duplicate"}


@dataclass(frozen=True)
class PauseRequest:
    """An operator's pause of a running step, waiting for the step to end."""

    actor: str
    reason: str
    control_id: str

    def to_json(self) -> str:
        return json.dumps({"actor": self.actor, "reason": self.reason,
                           "control_id": self.control_id})

    @classmethod
    def from_json(cls, raw: str) -> PauseRequest:
        data = json.loads(raw)
        return cls(str(data.get("actor", "")), str(data.get("reason", "")),
                   str(data.get("control_id", "")))


@dataclass(frozen=True)
class Patch:
    """The fields an operator's transition sets on a workflow; None leaves a field as is.

    `fresh_run` starts the current step over from its first attempt, as run `fresh_run`
    (no command, no query, no children, no cause, no pause). `epoch` (a restart's) also
    forgets every step's outputs: the task runs again from nothing, under that epoch.
    """

    state: TaskState | None = None
    step: int | None = None
    fresh_run: int | None = None
    epoch: int | None = None
    cause: str | None = None
    reason: str | None = None
    pause: PauseRequest | None = None
    clear_pause: bool = False
    final: FinalNotice | None = None  # to a final state: how its end is announced

    def fields(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.final is not None:
            out["finalise"] = self.final.to_json()
        if self.fresh_run is not None:
            out.update(step_state="scheduled", attempt="0", run=str(self.fresh_run),
                       command_id="", query_id="", waiting="0", cause="", reason="",
                       pause="")
        if self.epoch is not None:
            out.update(epoch=str(self.epoch), outputs="{}", children_cmd="")
        if self.state is not None:
            out["state"] = self.state
        if self.step is not None:
            out["step"] = str(self.step)
        if self.cause is not None:
            out["cause"] = self.cause
        if self.reason is not None:
            out["reason"] = self.reason
        if self.pause is not None:
            out["pause"] = self.pause.to_json()
        elif self.clear_pause:
            out["pause"] = ""
        return out


@dataclass(frozen=True)
class FinalNotice:
    """How a task's end is announced: its final TaskEvent, the release of its locks and its
    parent's count. The script that makes the state final keeps the notice with it and indexes
    the task as owing it, so an executor that dies before announcing leaves the announcement
    to the recovery sweep of any executor; it is done once `Journal.announced` says so."""

    state: TaskState
    previous: TaskState
    reason: str
    cause: str = ""
    actor: str = SOURCE
    run: int = 0
    step: int | None = None
    event_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> FinalNotice:
        data = json.loads(raw)
        step = data.get("step")
        extra = data.get("extra")
        return cls(
            state=cast(TaskState, str(data["state"])),
            previous=cast(TaskState, str(data["previous"])),
            reason=str(data.get("reason", "")), cause=str(data.get("cause", "")),
            actor=str(data.get("actor") or SOURCE), run=int(data.get("run") or 0),
            step=None if step is None else int(step),
            event_key=str(data["event_key"]) if data.get("event_key") else None,
            # cjson writes an empty table as {}; a notice made in Lua has no extra at all
            extra=dict(extra) if isinstance(extra, dict) else {},
        )


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
    pause: PauseRequest | None = None
    queries: int = 0
    resent: int = 0
    query_id: str = ""
    waiting: int = 0
    waiting_outputs: dict[str, OutputValue] | None = None
    reason: str = ""
    cause: str = ""
    final: FinalNotice | None = None  # the announcement its final state owes
    trace_context: str = ""  # packed: the trace it runs in ('' for one journaled without)

    @property
    def task_id(self) -> str:
        return str(self.task.task_id)


@dataclass(frozen=True)
class Ended:
    """Where a step's end left the workflow (and the pause request that stopped it)."""

    boundary: Boundary
    pause: PauseRequest | None = None


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


class Started(NamedTuple):
    """What creating a workflow did, and the pending control applied at creation."""

    outcome: StartOutcome
    pending: Pending | None = None


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
        self._counters = RisingCounters(redis)

    def controls_seen(self, task_id: str) -> str:
        """SET of the operator controls already applied to a task (private to the executor):
        a redelivered control must not act twice."""
        return self.keys.workflow_controls_seen(task_id)

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
            pause=PauseRequest.from_json(pause) if pause else None,
            queries=int(row.get("queries") or 0),
            resent=int(row.get("resent") or 0),
            query_id=row.get("query_id", ""),
            waiting=int(row.get("waiting") or 0),
            waiting_outputs=json.loads(row.get("waiting_outputs") or "{}"),
            reason=row.get("reason", ""),
            cause=row.get("cause", ""),
            final=FinalNotice.from_json(row["finalise"]) if row.get("finalise") else None,
            trace_context=row.get("trace", ""),
        )

    async def trace_of(self, task_id: str) -> str:
        """The packed trace context a workflow runs in ('' if none is kept)."""
        value = await self.redis.hget(self.keys.workflow(task_id), "trace")
        return text(value) if value else ""

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

    async def next_epoch(self, now: datetime) -> int:
        """A fencing epoch newer than any given so far (the scheduler's counter): a restarted
        workflow's commands are newer than every command of its earlier runs."""
        return await self._counters.next(self.keys.epoch(), now)

    async def next_command_seq(self, cluster: str, node_id: str, now: datetime) -> int:
        """Per-node command sequence of a cluster: agents refuse a command not newer than the
        last (the seq travels signed with its cluster, so one cluster's never fences another's)."""
        return await self._counters.next(self.keys.command_seq(cluster, node_id), now)

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

    async def start(self, task: OpsTask, epoch: int, kick_ms: int, now_ms: int) -> Started:
        """Create the workflow in the current trace; the outcome, and the pending control
        applied at creation."""
        task_id = str(task.task_id)
        reply = await self._start(
            keys=[self.keys.workflow(task_id), self.keys.workflow_controls(task_id),
                  self.keys.workflow_deadlines(), self.keys.workflow_unannounced()],
            args=[epoch, task.model_dump_json(), kick_ms, task_id, FINAL_TTL_S, now_ms,
                  current_trace()],
        )
        values = [_decode(v) for v in reply]
        outcome = cast(StartOutcome, values[0])
        if outcome in ("paused", "terminated"):
            return Started(outcome, Pending(outcome, values[1], values[2]))
        return Started(outcome)

    async def step_started(self, wf: Workflow, command_id: str, deadline_ms: int) -> bool:
        return bool(await self._started(
            keys=[self.keys.workflow(wf.task_id), self.keys.command_index(command_id),
                  self.keys.workflow_deadlines(), self.keys.workflow_retries()],
            args=[wf.step, wf.attempt, command_id, deadline_ms, wf.task_id, wf.run,
                  INDEX_TTL_S],
        ))

    async def step_ended(self, wf: Workflow, outcome: StepOutcome, final: FinalNotice,
                         now_ms: int, *, outputs: dict[str, Any] | None = None,
                         kick_ms: int = 0, retry_at_ms: int | None = None, reason: str = "",
                         cause: str = "") -> Ended:
        """End the current step (CAS on step, attempt, run and command id); `final` is how
        the task's end is announced if this ends it."""
        reply = await self._ended(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines(),
                  self.keys.workflow_retries(), self.keys.workflow_unannounced()],
            args=[wf.command_id, wf.step, wf.attempt, wf.run, outcome,
                  json.dumps(outputs or {}), wf.task_id, kick_ms,
                  "" if retry_at_ms is None else retry_at_ms, short_text(reason), cause,
                  FINAL_TTL_S, len(wf.task.steps), final.to_json(), now_ms],
        )
        values = [_decode(v) for v in reply]
        boundary = cast(Boundary, values[0])
        pause = PauseRequest.from_json(values[1]) if len(values) > 1 and values[1] else None
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

    async def wait_again(self, wf: Workflow, deadline_ms: int) -> bool:
        """Move a started step's deadline; a status query outstanding stays outstanding."""
        return bool(await self._answered(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines()],
            args=[wf.command_id, wf.query_id, deadline_ms, "keep", wf.task_id],
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

    async def transition(self, wf: Workflow, control_id: str, patch: Patch, *,
                         timers: Literal["keep", "clear", "kick"] = "keep", kick_ms: int = 0,
                         ttl: Literal["keep", "persist", "expire"] = "keep",
                         now_ms: int = 0) -> Transition:
        """Apply an operator's transition if the workflow is still as read (one to a final
        state, with the patch's `final`, owes its announcement from `now_ms` on)."""
        return _TRANSITIONS[int(await self._transition(
            keys=[self.keys.workflow(wf.task_id), self.keys.workflow_deadlines(),
                  self.keys.workflow_retries(), self.controls_seen(wf.task_id),
                  self.keys.workflow_unannounced()],
            args=[wf.version, wf.task_id, control_id, json.dumps(patch.fields()), timers,
                  kick_ms, ttl, FINAL_TTL_S, now_ms],
        ))]

    async def announced(self, task_id: str) -> None:
        """A task's end is announced: it owes nothing any more."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.keys.workflow_unannounced(), task_id)
            pipe.hdel(self.keys.workflow(task_id), "finalise")
            await pipe.execute()

    async def unannounced(self, ended_before_ms: int, limit: int = 200) -> list[str]:
        """Tasks ended before `ended_before_ms` whose end is still not announced (their
        executor died in between, or is slow past the grace)."""
        return members(await self.redis.zrangebyscore(
            self.keys.workflow_unannounced(), "-inf", ended_before_ms, start=0, num=limit))

    async def pending_control(self, task_id: str) -> Pending | None:
        raw = await self.redis.hgetall(self.keys.workflow_controls(task_id))
        if not raw:
            return None
        row = {text(k): text(v) for k, v in raw.items()}
        return Pending(row.get("action", ""), row.get("actor", ""), row.get("reason", ""))

    async def keep_pending(self, task_id: str, control_id: str, action: str | None,
                           actor: str, reason: str) -> PendingOutcome:
        """Keep (or with `action` None, withdraw) a control for a task not journaled yet."""
        return cast(PendingOutcome, _decode(await self._pending(
            keys=[self.keys.workflow(task_id), self.keys.workflow_controls(task_id),
                  self.controls_seen(task_id)],
            args=["clear" if action is None else "set", control_id, action or "", actor,
                  short_text(reason), FINAL_TTL_S],
        )))

    async def control_seen(self, task_id: str, control_id: str) -> bool:
        return bool(await self.redis.sismember(
            self.controls_seen(task_id), control_id))

    async def mark_control_seen(self, task_id: str, control_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self.controls_seen(task_id), control_id)
            pipe.expire(self.controls_seen(task_id), FINAL_TTL_S)
            await pipe.execute()

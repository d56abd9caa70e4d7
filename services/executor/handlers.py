"""Executor handlers: a scheduled task starts a workflow; results, deadlines, retries, child
tasks and operator controls advance it.

Every change goes through one compare-and-set script of the journal and is then announced
as a TaskEvent; nothing about a workflow lives in the process, so any instance can carry on
from any point after a crash. The order at each point is: change the journal, then act
(send the command, run the centre action, publish), so a duplicate delivery or a racing
sweep finds the step already taken and does nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid5

from redis.asyncio import Redis

from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import (
    Action,
    AddCapacity,
    Cancel,
    Clock,
    CommandPayload,
    CommandResult,
    MigrateJobs,
    OpsTask,
    QueryStatus,
    ReleaseNode,
    RemoveCapacity,
    Step,
    StepState,
    TaskControl,
    TaskEvent,
    TaskScheduled,
    TaskState,
    now_utc,
)
from schemas.topics import Topic
from services.executor.control import (
    FINAL_STATES,
    Decision,
    backoff_s,
    decide_control,
    failure_cause,
    is_permanent,
)
from services.executor.journal import (
    CANCEL_MARK,
    QUERY_MARK,
    ChildCounts,
    Ended,
    Journal,
    Patch,
    PauseRequest,
    Transition,
    Workflow,
)
from services.executor.ports import (
    CentreActions,
    CentreResult,
    Completed,
    Failed,
    Publisher,
    Waiting,
)
from services.executor.settings import ExecutorSettings
from services.shared.errors import INFRASTRUCTURE_ERRORS, TransientError
from services.shared.locks import Locks, lock_ttl_s
from services.shared.redis_client import Keys
from services.shared.signing import CommandSigner

log = logging.getLogger("clusterwarden.executor")
SOURCE = "executor"
MAX_OUTPUTS = 32  # the schema's bound on TaskEvent.outputs
_CENTRE_TYPES = (AddCapacity, RemoveCapacity, MigrateJobs, ReleaseNode)
# Controls that also apply to a parent's open children. Retry and jump do not: a retried
# parent step makes new children, and a step index means nothing in a child's plan.
FORWARDED_CONTROLS = frozenset({"pause", "resume", "terminate"})
_CONTROL_ATTEMPTS = 8


def command_id_for(task_id: UUID, step: int, attempt: int, run: int = 0) -> UUID:
    """The same step attempt always has the same command id (agents dedupe on it).

    `run` counts operator retries and jumps: a re-run must not get the agent's cached answer
    to the run before it.
    """
    suffix = f":r{run}" if run else ""
    return uuid5(ids.EXECUTOR, f"{task_id}:{step}:{attempt}{suffix}")


def query_id_for(command_id: str, number: int) -> UUID:
    return uuid5(ids.EXECUTOR, f"query:{command_id}:{number}")


def cancel_id_for(command_id: str) -> UUID:
    return uuid5(ids.EXECUTOR, f"cancel:{command_id}")


def agent_action(step: Step) -> Action | None:
    """The step's action if an agent carries it out; None for a centre action."""
    action = step.action
    if isinstance(action, _CENTRE_TYPES):
        return None
    return action


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _bounded(outputs: dict[str, Any]) -> dict[str, Any]:
    return dict(list(outputs.items())[:MAX_OUTPUTS])


class Executor:
    """Drives workflows one step at a time; all progress lives in the Redis journal."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, signer: CommandSigner,
                 bus: Publisher, redis: Redis, keys: Keys, centre: CentreActions, *,
                 clock: Clock = now_utc) -> None:
        self.settings = settings
        self.clock = clock
        self.journal = journal
        self.signer = signer
        self.bus = bus
        self.redis = redis
        self.keys = keys
        self.locks = Locks(redis, keys)
        self.centre = centre
        # Process bookkeeping only (has this process run its startup recovery?); every
        # workflow fact is in Redis.
        self._recovered = False

    # -------------------------------------------------------- starting a workflow

    async def on_scheduled(self, scheduled: TaskScheduled) -> None:
        task = scheduled.task
        outcome, pending = await self.journal.start(task, scheduled.epoch, self._kick_ms())
        if outcome == "stale":
            log.info("task %s epoch %d is not newer; ignored", task.task_id, scheduled.epoch)
            return
        if outcome == "takeover":
            log.warning("task %s taken over with epoch %d", task.task_id, scheduled.epoch)
            wf = await self.journal.load(str(task.task_id))
            if wf is not None and wf.state in FINAL_STATES:
                # Dispatched again after it ended: the locks the dispatch took are not its.
                await self.locks.release(str(task.task_id), task.mutex_keys)
            return  # the running workflow goes on; its deadline sweep covers a lost command
        if outcome == "terminated" and pending is not None:
            await self._finalise(task, "terminated", "dispatched",
                                 f"terminate: {pending.reason}", cause="terminated",
                                 actor=pending.actor)
            return
        if outcome == "paused" and pending is not None:
            await self.emit(task, "paused", "dispatched", actor=pending.actor, step=0,
                            reason=f"pause: {pending.reason}", outputs={"control": "pause"})
            return
        await self.emit(task, "running", "dispatched", reason=f"epoch {scheduled.epoch}")
        await self.kick(str(task.task_id))

    async def kick(self, task_id: str) -> bool:
        """Start the workflow's scheduled step, skipping those whose guard does not hold.

        False if the workflow is not running with a scheduled step (nothing to start).
        """
        wf = await self.journal.load(task_id)
        for _ in range(65):  # at most every step of a plan is skipped in a row
            if wf is None or wf.state != "running" or wf.step_state != "scheduled":
                return False
            step = wf.task.steps[wf.step]
            if step.guard is not None:
                guard = await self.centre.check_guard(wf.task, step)
                if not guard.holds:
                    if not await self._skip(wf, step, guard.why):
                        return True
                    wf = await self.journal.load(task_id)
                    continue
            await self._start(wf)
            return True
        return True

    async def _skip(self, wf: Workflow, step: Step, why: str) -> bool:
        """Record a step skipped by its guard; True if the next step is to be started."""
        outputs = {"skipped": True, "guard": step.guard or "", "reason": short_text(why)}
        ended = await self.journal.step_ended(wf, "skipped", outputs=outputs,
                                              kick_ms=self._kick_ms(),
                                              reason="every step completed or skipped")
        if ended.boundary == "stale":
            return False
        await self.emit(wf.task, "running", "running", step=wf.step, step_state="skipped",
                        outputs=outputs, run=wf.run,
                        reason=f"{step.name} skipped: guard {step.guard} does not hold: {why}")
        if ended.boundary == "next":
            return True
        await self._after_step(wf, ended, wf.step + 1)
        return False

    async def _start(self, wf: Workflow) -> None:
        task, index = wf.task, wf.step
        step = task.steps[index]
        now = self.clock()
        command_id = command_id_for(task.task_id, index, wf.attempt, wf.run)
        deadline_ms = _ms(now + timedelta(seconds=step.timeout_s))
        if not await self.journal.step_started(wf, str(command_id), deadline_ms):
            return  # the workflow moved on (another delivery or a sweep got here first)
        wf = replace(wf, step_state="started", command_id=str(command_id),
                     deadline_ms=deadline_ms, queries=0, resent=0, query_id="", waiting=0)
        await self.emit(task, "running", "running", step=index, step_state="started",
                        command_id=command_id, run=wf.run,
                        reason=f"{step.name}: {step.action.action} attempt {wf.attempt + 1}")
        if agent_action(step) is None:
            await self._run_centre(wf)
        else:
            await self._send(wf)

    async def _send(self, wf: Workflow) -> None:
        """Send the step's command (again, with the same command id, when resending)."""
        step = wf.task.steps[wf.step]
        action = agent_action(step)
        if action is None:
            raise TypeError(f"step {step.name} is a centre action, not a command")
        now = self.clock()
        ttl = min(self.settings.command_ttl_s, step.timeout_s)
        payload = CommandPayload.for_action(
            action, command_id=UUID(wf.command_id),
            seq=await self.journal.next_command_seq(action.node_id), epoch=wf.epoch,
            issued_at=now, expires_at=now + timedelta(seconds=ttl),
            task_id=wf.task.task_id, step_index=wf.step, dry_run=wf.task.dry_run,
        )
        await self.bus.publish(
            Topic.NODE_COMMANDS, self.signer.sign(payload, wf.task.cluster_id, SOURCE)
        )
        if self.settings.crash_at == f"after_send:{action.action}":
            # Fault injection for tests: die as a kill -9 would, before the step's result.
            log.critical("crash_at %s: exiting now", self.settings.crash_at)
            os._exit(137)

    # -------------------------------------------------------- centre actions and children

    async def _run_centre(self, wf: Workflow) -> None:
        step = wf.task.steps[wf.step]
        result: CentreResult
        try:
            result = await self.centre.run(wf.task, wf.step, UUID(wf.command_id),
                                           wf.task.dry_run)
        except INFRASTRUCTURE_ERRORS:
            raise  # fail closed: the step stays started and its deadline re-runs it
        except Exception as err:
            log.exception("task %s step %s: centre action failed", wf.task_id, step.name)
            result = Failed(f"centre_error: {err!r}"[:200], permanent=False)
        if isinstance(result, Completed):
            await self.step_succeeded(wf, dict(result.outputs))
        elif isinstance(result, Failed):
            await self.step_failed(wf, "failed", result.reason, permanent=result.permanent)
        elif isinstance(result, Waiting):
            await self._await_children(wf, result)
        else:
            raise TypeError(f"unknown centre result {result!r}")

    async def _await_children(self, wf: Workflow, waiting: Waiting) -> None:
        task, step = wf.task, wf.task.steps[wf.step]
        outputs = dict(waiting.outputs)
        if not waiting.children:
            await self.step_succeeded(wf, {**outputs, "children": 0, "succeeded": 0,
                                           "failed": 0})
            return
        counts = await self.journal.await_children(
            wf, [str(child.task_id) for child in waiting.children], outputs)
        if counts is None:
            return  # the step is no longer current
        if counts.settled:
            # A re-run after every child already finished (the notice of the last was lost).
            await self._children_settled(wf, counts, outputs)
            return
        await self.emit(task, "running", "running", step=wf.step, step_state="started",
                        command_id=UUID(wf.command_id), run=wf.run, tag="waiting",
                        outputs={**outputs, "children": counts.children},
                        reason=f"{step.name}: waiting for {counts.children} child task(s)")
        for child in waiting.children:
            # `created` first: the task store must know a task before any later transition.
            await self.bus.publish(Topic.OPS_TASK_EVENTS, TaskEvent(
                event_id=uuid5(ids.EXECUTOR, f"{child.task_id}:created"),
                source=SOURCE, occurred_at=self.clock(), cluster_id=child.cluster_id,
                subject=str(child.task_id), correlation_id=str(child.need_id),
                task_id=child.task_id, parent_task_id=child.parent_task_id, state="created",
                actor=SOURCE, task=child,
                reason=f"child of task {task.task_id} step {wf.step} ({step.name})",
            ))
            await self.bus.publish(Topic.OPS_TASKS, child)

    async def _child_finished(self, child: OpsTask, state: TaskState) -> None:
        """Record a child's final state at its parent; the last one ends the parent's step."""
        parent = await self.journal.load(str(child.parent_task_id))
        if parent is None or parent.state != "running" or parent.step_state != "started":
            return  # the parent no longer waits (terminated, timed out, moved on)
        counts = await self.journal.child_done(parent, str(child.task_id), state)
        if counts is None or not counts.settled:
            return
        await self._children_settled(parent, counts, parent.waiting_outputs or {})

    async def _children_settled(self, parent: Workflow, counts: ChildCounts,
                                outputs: dict[str, Any]) -> None:
        summary = {**outputs, "children": counts.children,
                   "succeeded": counts.children - counts.failed, "failed": counts.failed}
        if counts.failed == 0:
            await self.step_succeeded(parent, summary)
        else:
            # Permanent: each child already made its own attempts.
            await self.step_failed(
                parent, "failed",
                f"children_failed: {counts.failed} of {counts.children} child tasks failed",
                permanent=True, cause="children_failed")

    # -------------------------------------------------------- results

    async def on_result(self, result: CommandResult) -> None:
        indexed = await self.journal.task_of_command(str(result.command_id))
        if indexed is None:
            return  # not a command of ours (or its index expired)
        if indexed.startswith(CANCEL_MARK):
            log.info("cancel %s for task %s: %s %s %s", result.command_id,
                     indexed.removeprefix(CANCEL_MARK), result.outcome, result.reason,
                     dict(result.outputs))
            return
        if indexed.startswith(QUERY_MARK):
            await self._on_query_answer(indexed.removeprefix(QUERY_MARK), result)
            return
        wf = await self.journal.load(indexed)
        if (wf is None or wf.state != "running" or wf.step_state != "started"
                or wf.command_id != str(result.command_id)):
            return  # a late answer to an attempt already given up on
        await self._settle(wf, result.outcome, result.reason, dict(result.outputs))

    async def _settle(self, wf: Workflow, outcome: str, reason: str,
                      outputs: dict[str, Any]) -> None:
        if outcome == "succeeded":
            await self.step_succeeded(wf, outputs)
        else:
            await self.step_failed(wf, outcome, reason or outcome)

    async def _on_query_answer(self, task_id: str, result: CommandResult) -> None:
        """The agent's answer about a command that got no answer in time."""
        wf = await self.journal.load(task_id)
        if (wf is None or wf.state != "running" or wf.step_state != "started"
                or wf.query_id != str(result.command_id)):
            return
        step = wf.task.steps[wf.step]
        queried = result.outputs.get("queried_command_id")
        if result.outcome == "unknown" and result.reason == "not_in_journal":
            deadline_ms = _ms(self.clock() + timedelta(seconds=step.timeout_s))
            if wf.resent == 0 and await self.journal.query_answered(wf, deadline_ms,
                                                                    resend=True):
                await self.emit(wf.task, "running", "running", step=wf.step,
                                step_state="started", command_id=UUID(wf.command_id),
                                run=wf.run, tag="resent",
                                reason=f"{step.name}: the agent never got the command; "
                                       "sent again with the same command id")
                await self._send(wf)
                return
            await self.step_failed(wf, "unknown", "timeout: the agent never got the command")
        elif result.outcome == "unknown" and result.reason == "in_progress":
            deadline_ms = _ms(self.clock() + timedelta(seconds=step.timeout_s))
            if await self.journal.query_answered(wf, deadline_ms, resend=False):
                await self.emit(wf.task, "running", "running", step=wf.step,
                                step_state="started", command_id=UUID(wf.command_id),
                                run=wf.run, tag=f"extended{wf.queries}",
                                reason=f"{step.name}: still in progress on the agent; "
                                       f"deadline extended by {step.timeout_s:g} s")
        elif queried != wf.command_id or result.outcome == "unknown":
            # The query itself was refused (expired, clock skew...): the command's fate is
            # still unknown, which counts as a timeout.
            await self.step_failed(wf, "unknown",
                                   f"timeout: status query {result.outcome} {result.reason}")
        else:
            outputs = {k: v for k, v in result.outputs.items() if not k.startswith("queried_")}
            await self._settle(wf, result.outcome, result.reason, outputs)

    # -------------------------------------------------------- ending steps

    async def step_succeeded(self, wf: Workflow, outputs: dict[str, Any]) -> None:
        task, index = wf.task, wf.step
        outputs = _bounded(outputs)
        ended = await self.journal.step_ended(wf, "completed", outputs=outputs,
                                              kick_ms=self._kick_ms(),
                                              reason="every step completed or skipped")
        if ended.boundary == "stale":
            return
        await self.emit(task, "running", "running", step=index, step_state="completed",
                        command_id=UUID(wf.command_id), outputs=outputs, run=wf.run,
                        reason=f"{task.steps[index].name} completed")
        await self._after_step(wf, ended, index + 1)

    async def step_failed(self, wf: Workflow, outcome: str, reason: str, *,
                          permanent: bool = False, cause: str | None = None) -> None:
        """End a failed attempt: retry later (backoff) if it may help, else fail the task."""
        step = wf.task.steps[wf.step]
        permanent = permanent or is_permanent(outcome, reason)
        cause = cause or failure_cause(outcome)
        retry = not permanent and wf.attempt + 1 < step.max_attempts
        delay_s = backoff_s(wf.attempt, self.settings.backoff_base_s,
                            self.settings.backoff_max_s)
        final_reason = f"step {step.name}: {outcome} {reason}"
        ended = await self.journal.step_ended(
            wf, "failed", retry_at_ms=_ms(self.clock()) + int(delay_s * 1000) if retry else None,
            reason=final_reason, cause=cause)
        if ended.boundary == "stale":
            return
        then = (f"retry in {delay_s:g} s" if retry
                else "permanent" if permanent else "no attempt left")
        await self.emit(wf.task, "running", "running", step=wf.step, step_state="failed",
                        command_id=UUID(wf.command_id) if wf.command_id else None,
                        run=wf.run, outputs={"cause": cause, "permanent": permanent},
                        reason=f"{step.name} attempt {wf.attempt + 1}: {outcome} {reason}; "
                               f"{then}")
        await self._after_step(wf, ended, wf.step, cause=cause, reason=final_reason)

    async def _after_step(self, wf: Workflow, ended: Ended, paused_at: int, *,
                          cause: str = "", reason: str = "") -> None:
        if ended.boundary == "next":
            await self.kick(wf.task_id)
        elif ended.boundary == "paused":
            pause = ended.pause or PauseRequest("", "", "")
            await self.emit(wf.task, "paused", "running", step=paused_at, run=wf.run,
                            actor=pause.actor or SOURCE, tag=f"paused:{pause.control_id}",
                            outputs={"control": "pause"}, reason=f"pause: {pause.reason}")
        elif ended.boundary == "succeeded":
            await self._finalise(wf.task, "succeeded", "running", "every step completed",
                                 run=wf.run)
        elif ended.boundary == "failed":
            await self._finalise(wf.task, "failed", "running", reason, cause=cause,
                                 run=wf.run, step=wf.step)
        # "retry": the retry sweep starts the next attempt when its backoff is over

    async def _finalise(self, task: OpsTask, state: TaskState, previous: TaskState,
                        reason: str, *, cause: str = "", actor: str = SOURCE, run: int = 0,
                        step: int | None = None, event_key: str | None = None) -> None:
        """After the journal's final state: locks, the final event, the parent's count."""
        await self.locks.release(str(task.task_id), task.mutex_keys)
        # need_kind and kind ride along so the scheduler's breaker can count the outcome;
        # cause lets it leave out what is not an adjustment failure (agent rejections).
        outputs: dict[str, Any] = {"need_kind": task.need_kind, "kind": task.kind}
        if cause:
            outputs["cause"] = cause
        await self.emit(task, state, previous, reason=reason, outputs=outputs, actor=actor,
                        run=run, step=step, event_key=event_key)
        log.info("task %s %s: %s", task.task_id, state, reason)
        if task.parent_task_id is not None:
            await self._child_finished(task, state)

    # -------------------------------------------------------- deadlines, retries, recovery

    async def sweep_deadlines(self) -> None:
        """Overdue steps are recovered (status query, resend, re-run) or failed as timeouts;
        late scheduled steps are started; retries whose backoff is over run."""
        if not self._recovered:
            await self.recover()
            self._recovered = True
        now_ms = _ms(self.clock())
        for task_id in await self.journal.overdue(now_ms):
            await self._guarded(task_id, self._overdue(task_id, now_ms))
        for task_id in await self.journal.due_retries(now_ms):
            await self._guarded(task_id, self._retry_due(task_id))

    async def _guarded(self, task_id: str, work: Any) -> None:
        """One workflow's failure must not stop the sweep of the others; Redis down does."""
        try:
            await work
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception:
            log.exception("sweep of task %s failed", task_id)

    async def recover(self) -> None:
        """On startup: ask the agents about every command left without an answer."""
        for task_id in await self.journal.open_workflows():
            await self._guarded(task_id, self._recover_one(task_id))

    async def _recover_one(self, task_id: str) -> None:
        wf = await self.journal.load(task_id)
        if wf is None or wf.state != "running":
            await self.journal.forget_timers(task_id)
        elif wf.step_state == "scheduled":
            await self.kick(task_id)
        elif (wf.step_state == "started" and not wf.query_id
              and agent_action(wf.task.steps[wf.step]) is not None):
            await self._send_query(wf)
        # a started centre step is re-run by its deadline (its provider is idempotent)

    async def _retry_due(self, task_id: str) -> None:
        if not await self.kick(task_id):
            await self.journal.forget_retry(task_id)

    async def _overdue(self, task_id: str, now_ms: int) -> None:
        wf = await self.journal.load(task_id)
        if wf is None or wf.state != "running":
            await self.journal.forget_timers(task_id)
            return
        if wf.step_state == "scheduled":
            await self.kick(task_id)
            return
        if wf.step_state != "started" or wf.deadline_ms > now_ms:
            return  # moved on, or its deadline was just extended
        step = wf.task.steps[wf.step]
        if agent_action(step) is None:
            await self._centre_overdue(wf, step, now_ms)
        elif wf.query_id:
            await self.step_failed(wf, "unknown", "timeout: no answer to the status query")
        elif not await self._send_query(wf):
            await self.step_failed(wf, "unknown",
                                   f"timeout: no answer after {wf.queries} status queries")

    async def _centre_overdue(self, wf: Workflow, step: Step, now_ms: int) -> None:
        deadline_ms = now_ms + int(step.timeout_s * 1000)
        if wf.waiting:
            counts = await self.journal.child_counts(wf.task_id, wf.step)
            if counts.settled:  # the last child's notice was lost
                await self._children_settled(wf, counts, wf.waiting_outputs or {})
                return
            if wf.pause is not None:
                # The operator holds the task (and its children): waiting is not a timeout.
                await self.journal.extend_deadline(wf, deadline_ms)
                return
            if await self.journal.recovery_started(wf, "", deadline_ms, 1):
                # Once: run the action again (the centre answers with the same children) so
                # children lost between the journal and the bus are published again.
                await self._run_centre(replace(wf, queries=wf.queries + 1,
                                               deadline_ms=deadline_ms))
                return
            # Open children are left to finish on their own: each holds its own locks and
            # deadlines; only the parent's wait is over.
            await self.step_failed(
                wf, "unknown", f"timeout: {counts.children - counts.finished} of "
                f"{counts.children} child tasks still open",
                permanent=True, cause="timeout")
            return
        if await self.journal.recovery_started(wf, "", deadline_ms,
                                               self.settings.max_status_queries):
            # The action did not report back (its process died?): run it again under the
            # same command id, which the centre treats as the same request.
            log.warning("task %s step %s: centre action unfinished; running it again",
                        wf.task_id, step.name)
            await self._run_centre(replace(wf, queries=wf.queries + 1,
                                           deadline_ms=deadline_ms))
            return
        await self.step_failed(wf, "unknown", "timeout: the centre action did not finish")

    async def _send_query(self, wf: Workflow) -> bool:
        """Ask the agent what became of the step's command (once per deadline)."""
        step = wf.task.steps[wf.step]
        action = agent_action(step)
        if action is None:
            return False
        query_id = query_id_for(wf.command_id, wf.queries)
        now = self.clock()
        timeout_s = self.settings.status_query_timeout_s
        if not await self.journal.recovery_started(
                wf, str(query_id), _ms(now + timedelta(seconds=timeout_s)),
                self.settings.max_status_queries):
            return False
        payload = CommandPayload.for_action(
            QueryStatus(node_id=action.node_id, command_id=UUID(wf.command_id)),
            command_id=query_id, epoch=wf.epoch, issued_at=now, expires_at=now + timedelta(
                seconds=min(self.settings.command_ttl_s, max(timeout_s, 1.0))),
            task_id=wf.task.task_id, step_index=wf.step,
        )
        await self.bus.publish(
            Topic.NODE_COMMANDS, self.signer.sign(payload, wf.task.cluster_id, SOURCE))
        await self.emit(wf.task, "running", "running", step=wf.step, step_state="started",
                        command_id=UUID(wf.command_id), run=wf.run, tag=f"query{wf.queries}",
                        reason=f"{step.name}: no answer yet; asked the agent for the status "
                               f"of its command (query {wf.queries + 1})")
        return True

    async def _cancel(self, wf: Workflow) -> None:
        """Ask the agent to cancel the step's running command (terminate)."""
        action = agent_action(wf.task.steps[wf.step])
        if action is None or wf.step_state != "started" or not wf.command_id:
            return
        cancel_id = cancel_id_for(wf.command_id)
        await self.journal.index_cancel(str(cancel_id), wf.task_id)
        now = self.clock()
        payload = CommandPayload.for_action(
            Cancel(node_id=action.node_id, command_id=UUID(wf.command_id)),
            command_id=cancel_id, seq=await self.journal.next_command_seq(action.node_id),
            epoch=wf.epoch, issued_at=now,
            expires_at=now + timedelta(seconds=self.settings.command_ttl_s),
            task_id=wf.task.task_id, step_index=wf.step, dry_run=wf.task.dry_run,
        )
        await self.bus.publish(
            Topic.NODE_COMMANDS, self.signer.sign(payload, wf.task.cluster_id, SOURCE))

    # -------------------------------------------------------- operator controls

    async def on_control(self, control: TaskControl) -> None:
        await self.apply_control(control, control.task_id, str(control.event_id))

    async def apply_control(self, control: TaskControl, task_id: UUID,
                            control_id: str) -> None:
        """Apply `control` to `task_id` (the task it names, or one of its children)."""
        for _ in range(_CONTROL_ATTEMPTS):
            wf = await self.journal.load(str(task_id))
            if wf is None:
                done = await self._control_unseen(control, task_id, control_id)
            else:
                done = await self._control_workflow(control, wf, control_id)
            if done:
                return
        raise TransientError(f"task {task_id} kept changing under control {control_id}")

    async def _control_unseen(self, control: TaskControl, task_id: UUID,
                              control_id: str) -> bool:
        """A control for a task not received yet: kept, and applied when the task arrives."""
        tid = str(task_id)
        if await self.journal.control_seen(tid, control_id):
            return True
        pending = await self.journal.pending_control(tid)
        state: TaskState = "queued"
        if pending is not None and pending.action == "pause":
            state = "paused"
        elif pending is not None and pending.action == "terminate":
            state = "terminated"
        decision = decide_control(state, None, control.action, control.step_index, 0,
                                  seen=False)
        if not decision.allowed:
            await self._emit_unseen(control, task_id, control_id, state,
                                    f"refused {control.action}: {decision.reason}",
                                    refused=True)
            await self.journal.mark_control_seen(tid, control_id)
            return True
        keep = None if decision.new_state == "queued" else control.action
        outcome = await self.journal.keep_pending(tid, control_id, keep, control.actor,
                                                  control.reason)
        if outcome == "exists":
            return False  # the task arrived meanwhile: apply to the workflow
        if outcome == "ok":
            await self._emit_unseen(control, task_id, control_id, "queued",
                                    f"{control.action}: {control.reason} "
                                    f"({decision.reason})", refused=False)
        return True

    async def _control_workflow(self, control: TaskControl, wf: Workflow,
                                control_id: str) -> bool:
        """Decide and apply a control to a journaled workflow; False if it changed meanwhile."""
        if await self.journal.control_seen(wf.task_id, control_id):
            return True
        decision = decide_control(wf.state, wf.step_state, control.action, control.step_index,
                                  len(wf.task.steps), pause_requested=wf.pause is not None)
        if not decision.allowed:
            await self._refuse(control, wf, control_id, decision.reason)
            return True
        if self._needs_locks(control, wf, decision):
            held = await self.locks.acquire(
                wf.task_id, wf.task.mutex_keys,
                lock_ttl_s(wf.task, self.settings.lock_margin_s))
            if held is not None:
                await self._refuse(control, wf, control_id,
                                   f"lock {held[0]} is held by task {held[1]}")
                return True
        applied = await self._apply(control, wf, control_id, decision)
        if applied == "changed":
            return False
        if applied == "duplicate":
            return True  # a redelivered control, applied before
        await self._after_control(control, wf, control_id, decision)
        if control.action in FORWARDED_CONTROLS:
            for child in await self.journal.open_children(wf.task_id, wf.step):
                await self.apply_control(
                    control.model_copy(update={"reason": short_text(
                        f"via parent {wf.task_id}: {control.reason}")}),
                    UUID(child), str(uuid5(ids.EXECUTOR, f"{control_id}:{child}")))
        return True

    @staticmethod
    def _needs_locks(control: TaskControl, wf: Workflow, decision: Decision) -> bool:
        """Whether the task must hold its locks again: it is about to run (or, jumped from
        a failure, to wait paused for a resume) and may have released or lost them."""
        if control.action == "retry":
            return True
        if control.action == "resume":
            return not decision.withdraw_pause
        return control.action == "jump" and wf.state == "failed"

    async def _apply(self, control: TaskControl, wf: Workflow, control_id: str,
                     decision: Decision) -> Transition:
        action, transition = control.action, self.journal.transition
        if action == "pause" and decision.at_boundary:
            request = PauseRequest(control.actor, control.reason, control_id)
            return await transition(wf, control_id, Patch(pause=request))
        if action == "pause":
            return await transition(wf, control_id, Patch(state="paused"), timers="clear")
        if action == "resume" and decision.withdraw_pause:
            return await transition(wf, control_id, Patch(clear_pause=True))
        if action == "resume":
            return await transition(wf, control_id, Patch(state="running", clear_pause=True),
                                    timers="kick", kick_ms=self._kick_ms())
        if action == "retry":
            return await transition(wf, control_id, Patch(state="running", fresh_run=wf.run + 1),
                                    timers="kick", kick_ms=self._kick_ms(), ttl="persist")
        if action == "jump":
            return await transition(
                wf, control_id, Patch(state="paused", step=control.step_index,
                                      fresh_run=wf.run + 1), timers="clear", ttl="persist")
        return await transition(
            wf, control_id, Patch(state="terminated", cause="terminated", clear_pause=True,
                                  reason=short_text(f"terminate: {control.reason}")),
            timers="clear", ttl="expire")

    async def _after_control(self, control: TaskControl, wf: Workflow, control_id: str,
                             decision: Decision) -> None:
        """Announce an applied control (actor: the operator), then act on it."""
        previous = wf.state
        key = f"control:{control_id}"
        reason = f"{control.action}: {control.reason} ({decision.reason})"
        if control.action == "terminate":
            await self._cancel(wf)
            await self._finalise(wf.task, "terminated", previous,
                                 f"terminate: {control.reason}", cause="terminated",
                                 actor=control.actor, run=wf.run, step=wf.step,
                                 event_key=key)
            return
        state: TaskState = decision.new_state
        if decision.at_boundary or decision.withdraw_pause:
            state = "running"  # the state changes (if at all) when the step ends
        step = control.step_index if control.action == "jump" else wf.step
        await self.emit(wf.task, state, previous, step=step, actor=control.actor,
                        reason=reason, outputs={"control": control.action},
                        event_key=key)
        if state == "running" and not (decision.at_boundary or decision.withdraw_pause):
            await self.kick(wf.task_id)

    async def _refuse(self, control: TaskControl, wf: Workflow, control_id: str,
                      why: str) -> None:
        await self.emit(wf.task, wf.state, wf.state, step=wf.step, actor=control.actor,
                        reason=f"refused {control.action}: {why}",
                        outputs={"control": control.action, "refused": True},
                        event_key=f"control:{control_id}")
        await self.journal.mark_control_seen(wf.task_id, control_id)
        log.info("task %s: refused %s by %s: %s", wf.task_id, control.action, control.actor,
                 why)

    async def _emit_unseen(self, control: TaskControl, task_id: UUID, control_id: str,
                           state: TaskState, reason: str, *, refused: bool) -> None:
        outputs: dict[str, Any] = {"control": control.action}
        if refused:
            outputs["refused"] = True
        else:
            outputs["pending"] = True
        await self.bus.publish(Topic.OPS_TASK_EVENTS, TaskEvent(
            event_id=uuid5(ids.EXECUTOR, f"control:{control_id}"), source=SOURCE,
            occurred_at=self.clock(), cluster_id=control.cluster_id, subject=str(task_id),
            correlation_id=control.correlation_id, task_id=task_id, state=state,
            previous_state=state, actor=control.actor, reason=short_text(reason), outputs=outputs,
        ))

    # -------------------------------------------------------- events

    def _kick_ms(self) -> int:
        """When a scheduled step must have started by, else the sweep starts it."""
        return _ms(self.clock() + timedelta(seconds=self.settings.start_grace_s))

    async def emit(self, task: OpsTask, state: TaskState, previous: TaskState, *,
                   reason: str, step: int | None = None, step_state: StepState | None = None,
                   command_id: UUID | None = None, outputs: dict[str, Any] | None = None,
                   actor: str = SOURCE, run: int = 0, tag: str = "",
                   event_key: str | None = None) -> None:
        """Publish a transition; the same transition always gets the same event id."""
        discriminator = f"{state}:{step}:{step_state}:{command_id}"
        if run:
            discriminator += f":r{run}"
        if tag:
            discriminator += f":{tag}"
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS,
            TaskEvent(
                event_id=uuid5(ids.EXECUTOR, event_key or f"{task.task_id}:{discriminator}"),
                source=SOURCE, occurred_at=self.clock(), cluster_id=task.cluster_id,
                subject=str(task.task_id), correlation_id=str(task.need_id),
                task_id=task.task_id, parent_task_id=task.parent_task_id,
                state=state, previous_state=previous, step_index=step, step_state=step_state,
                command_id=command_id, actor=actor, reason=short_text(reason),
                outputs=_bounded(outputs or {}),
            ),
        )


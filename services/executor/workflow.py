"""The workflow core: a scheduled task starts a workflow, its steps run one at a time (an
agent's command or a centre action, child tasks included), and each step's end moves the
workflow on, retries it after a backoff, pauses it or finishes the task.

Every change goes through one compare-and-set script of the journal and is then announced
as a TaskEvent; nothing about a workflow lives in the process, so any instance can carry on
from any point after a crash. The order at each point is: change the journal, then act
(send the command, run the centre action, publish), so a duplicate delivery or a racing
sweep finds the step already taken and does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import UUID

from opentelemetry import trace

from common.clock import Clock, epoch_ms
from common.crashpoints import crash_point
from common.errors import INFRASTRUCTURE_ERRORS, PermanentError
from common.reportauth import WRONG_SENDER
from common.tracing import task_attributes
from schemas.envelope import short_text
from schemas.events.v1 import (
    CommandResult,
    OpsTask,
    Step,
    TaskScheduled,
    TaskState,
)
from services.executor.commands import (
    CommandSender,
    agent_action,
    answered_by_addressee,
    command_id_for,
)
from services.executor.control import (
    FINAL_STATES,
    backoff_s,
    failure_cause,
    is_permanent,
)
from services.executor.events import SOURCE, TaskEvents, bounded
from services.executor.journal import (
    ChildCounts,
    Ended,
    FinalNotice,
    Journal,
    PauseRequest,
    Workflow,
)
from services.executor.ports import (
    BackendSteps,
    CentreActions,
    CentreResult,
    Completed,
    Failed,
    LocalAgentsOnly,
    Waiting,
)
from services.executor.settings import ExecutorSettings
from services.executor.spans import step_span, tracer
from services.executor.step_timer import StepTimer
from services.shared.locks import Locks, lock_ttl_s

log = logging.getLogger("clusterwarden.executor")


class WorkflowCore:
    """Drives workflows one step at a time; all progress lives in the Redis journal."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, locks: Locks,
                 centre: CentreActions, events: TaskEvents, commands: CommandSender,
                 clock: Clock, backends: BackendSteps | None = None) -> None:
        self.settings = settings
        self.journal = journal
        self.locks = locks
        self.centre = centre
        # Node steps of clusters with a backend other than the local agents (Kubernetes).
        self.backends: BackendSteps = backends or LocalAgentsOnly()
        self.events = events
        self.commands = commands
        self.clock = clock
        self._running: set[asyncio.Task[None]] = set()
        self.step_timer = StepTimer()

    # -------------------------------------------------------- starting a workflow

    async def on_scheduled(self, scheduled: TaskScheduled) -> None:
        # The workflow keeps this span's context: its steps are its children wherever
        # they start (a result's handler, a sweep, an operator's control).
        with tracer.start_as_current_span("executor.task", attributes={
                **task_attributes(scheduled.task), "task.epoch": scheduled.epoch}):
            await self._scheduled(scheduled)

    async def _scheduled(self, scheduled: TaskScheduled) -> None:
        task = scheduled.task
        outcome, pending = await self.journal.start(task, scheduled.epoch, self.kick_ms(),
                                                    epoch_ms(self.clock()))
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
            await self.finalise(task, FinalNotice(
                "terminated", "dispatched", f"terminate: {pending.reason}", cause="terminated",
                actor=pending.actor or SOURCE))
            return
        if outcome == "paused" and pending is not None:
            await self.events.emit(task, "paused", "dispatched", actor=pending.actor, step=0,
                                   reason=f"pause: {pending.reason}", outputs={"control": "pause"})
            return
        await self.events.emit(task, "running", "dispatched", reason=f"epoch {scheduled.epoch}")
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
            # A span per step, skipped ones included: the trace shows the whole plan.
            with step_span("executor.step", wf) as span:
                if step.guard is not None:
                    guard = await self.centre.check_guard(wf.task, step)
                    if not guard.holds:
                        span.set_attribute("step.state", "skipped")
                        if not await self._skip(wf, step, guard.why):
                            return True
                        wf = await self.journal.load(task_id)
                        continue
                span.set_attribute("step.state", "started")
                await self._start(wf)
            return True
        return True

    async def _skip(self, wf: Workflow, step: Step, why: str) -> bool:
        """Record a step skipped by its guard; True if the next step is to be started."""
        outputs = {"skipped": True, "guard": step.guard or "", "reason": short_text(why)}
        final = succeeded(wf)
        ended = await self.journal.step_ended(wf, "skipped", final, epoch_ms(self.clock()),
                                              outputs=outputs, kick_ms=self.kick_ms(),
                                              reason="every step completed or skipped")
        if ended.boundary == "stale":
            return False
        await self.events.emit(wf.task, "running", "running", step=wf.step, step_state="skipped",
                               outputs=outputs, run=wf.run,
                               reason=f"{step.name} skipped: guard {step.guard} does not "
                                      f"hold: {why}")
        if ended.boundary == "next":
            return True
        await self._after_step(wf, ended, wf.step + 1, final)
        return False

    async def _start(self, wf: Workflow) -> None:
        task, index = wf.task, wf.step
        step = task.steps[index]
        now = self.clock()
        command_id = command_id_for(task.task_id, index, wf.attempt, wf.run)
        deadline_ms = epoch_ms(now + timedelta(seconds=step.timeout_s))
        if not await self.journal.step_started(wf, str(command_id), deadline_ms):
            return  # the workflow moved on (another delivery or a sweep got here first)
        self.step_timer.started(str(command_id))
        trace.get_current_span().set_attribute("command.id", str(command_id))
        wf = replace(wf, step_state="started", command_id=str(command_id),
                     deadline_ms=deadline_ms, queries=0, resent=0, query_id="", waiting=0)
        await self.events.emit(task, "running", "running", step=index, step_state="started",
                               command_id=command_id, run=wf.run,
                               reason=f"{step.name}: {step.action.action} attempt {wf.attempt + 1}")
        # Fenced on the task's locks before it acts, and they are renewed so: a task whose
        # lock lapsed and was taken by another must not act on the same target.
        held = await self.locks.acquire(wf.task_id, task.mutex_keys,
                                        lock_ttl_s(task, self.settings.lock_margin_s))
        if held is not None:
            await self.step_failed(wf, "failed", f"lock_lost: lock {held.lock} is held by "
                                                 f"task {held.owner}", permanent=True)
            return
        if await self.backends.handles(task, step):
            self._in_background(wf)
        elif await self.runs_in_centre(wf):
            await self.run_centre(wf)
        else:
            await self.commands.send(wf)

    def _in_background(self, wf: Workflow) -> None:
        """Runs a step through the cluster's backend beside the consumer: a drain takes
        seconds (evictions paced by the budget, replacements awaited), and run inline it
        would hold every other scheduled task behind it (a fault burst's drains would run one
        after another). The journal already says the step started: if the process dies
        meanwhile, the deadline sweep runs it again, as for a lost agent command."""
        run = asyncio.create_task(self._run_backend_step(wf),
                                  name=f"step {wf.task_id}/{wf.step}")
        self._running.add(run)
        run.add_done_callback(self._running.discard)

    async def _run_backend_step(self, wf: Workflow) -> None:
        try:
            await self.run_centre(wf)
        except INFRASTRUCTURE_ERRORS:
            # Fail closed, as inline: the step stays started and its deadline re-runs it.
            log.warning("task %s step %d: left started for the deadline sweep", wf.task_id,
                        wf.step, exc_info=True)

    async def idle(self) -> None:
        """Waits until no backend step runs (those a finished one starts included)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def stop(self) -> None:
        """Cancels the backend steps still running (on shutdown): each stays started in the
        journal, and the deadline sweep of the next executor runs it again."""
        for run in list(self._running):
            run.cancel()
        await asyncio.gather(*list(self._running), return_exceptions=True)

    # -------------------------------------------------------- centre actions and children

    async def runs_in_centre(self, wf: Workflow) -> bool:
        """Whether the executor carries out the current step itself (a centre action, or a
        node step through the cluster's backend) rather than sending an agent a command."""
        step = wf.task.steps[wf.step]
        return agent_action(step) is None or await self.backends.handles(wf.task, step)

    async def run_centre(self, wf: Workflow) -> None:
        step = wf.task.steps[wf.step]
        result: CentreResult
        # The cluster's backend first: on Kubernetes even a centre action (migrate_jobs,
        # capacity) is the backend's, not the local agents' and provider's.
        runner: CentreActions | BackendSteps = (
            self.backends if await self.backends.handles(wf.task, step) else self.centre)
        try:
            result = await runner.run(wf.task, wf.step, UUID(wf.command_id), wf.task.dry_run)
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
            await self.children_settled(wf, counts, outputs)
            return
        await self.events.emit(task, "running", "running", step=wf.step, step_state="started",
                               command_id=UUID(wf.command_id), run=wf.run, tag="waiting",
                               outputs={**outputs, "children": counts.children},
                               reason=f"{step.name}: waiting for {counts.children} child task(s)")
        for child in waiting.children:
            await self.events.hand_over_child(task, wf.step, step.name, child)

    async def _child_finished(self, child: OpsTask, state: TaskState) -> None:
        """Record a child's final state at its parent; the last one ends the parent's step."""
        parent = await self.journal.load(str(child.parent_task_id))
        if parent is None or parent.state != "running" or parent.step_state != "started":
            return  # the parent no longer waits (terminated, timed out, moved on)
        counts = await self.journal.child_done(parent, str(child.task_id), state)
        if counts is None or not counts.settled:
            return
        await self.children_settled(parent, counts, parent.waiting_outputs or {})

    async def children_settled(self, parent: Workflow, counts: ChildCounts,
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

    async def on_result(self, task_id: str, result: CommandResult) -> None:
        """An agent's answer to the command of task `task_id`'s current step."""
        wf = await self.journal.load(task_id)
        if (wf is None or wf.state != "running" or wf.step_state != "started"
                or wf.command_id != str(result.command_id)):
            return  # a late answer to an attempt already given up on
        if (refused := answered_by_addressee(wf, result)) is not None:
            raise PermanentError(WRONG_SENDER, refused)
        with step_span("executor.step.result", wf) as span:
            span.set_attributes({"step.outcome": result.outcome,
                                 "step.reason": short_text(result.reason)})
            await self.settle(wf, result.outcome, result.reason, dict(result.outputs))

    async def settle(self, wf: Workflow, outcome: str, reason: str,
                     outputs: dict[str, Any]) -> None:
        if outcome == "succeeded":
            await self.step_succeeded(wf, outputs)
        else:
            await self.step_failed(wf, outcome, reason or outcome)

    # -------------------------------------------------------- ending steps

    async def step_succeeded(self, wf: Workflow, outputs: dict[str, Any]) -> None:
        task, index = wf.task, wf.step
        outputs = bounded(outputs)
        final = succeeded(wf)
        ended = await self.journal.step_ended(wf, "completed", final, epoch_ms(self.clock()),
                                              outputs=outputs, kick_ms=self.kick_ms(),
                                              reason="every step completed or skipped")
        if ended.boundary == "stale":
            return
        self.step_timer.ended(task, index, wf.command_id, "completed")
        await self.events.emit(task, "running", "running", step=index, step_state="completed",
                               command_id=UUID(wf.command_id), outputs=outputs, run=wf.run,
                               reason=f"{task.steps[index].name} completed")
        await self._after_step(wf, ended, index + 1, final)

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
        now_ms = epoch_ms(self.clock())
        retry_at_ms = now_ms + int(delay_s * 1000) if retry else None
        final = FinalNotice("failed", "running", final_reason, cause=cause, run=wf.run,
                            step=wf.step)
        ended = await self.journal.step_ended(wf, "failed", final, now_ms,
                                              retry_at_ms=retry_at_ms, reason=final_reason,
                                              cause=cause)
        if ended.boundary == "stale":
            return
        self.step_timer.ended(wf.task, wf.step, wf.command_id, "failed")
        then = (f"retry in {delay_s:g} s" if retry
                else "permanent" if permanent else "no attempt left")
        await self.events.emit(wf.task, "running", "running", step=wf.step, step_state="failed",
                               command_id=UUID(wf.command_id) if wf.command_id else None,
                               run=wf.run, outputs={"cause": cause, "permanent": permanent},
                               reason=f"{step.name} attempt {wf.attempt + 1}: {outcome} {reason}; "
                                      f"{then}")
        await self._after_step(wf, ended, wf.step, final)

    async def _after_step(self, wf: Workflow, ended: Ended, paused_at: int,
                          final: FinalNotice) -> None:
        if ended.boundary == "next":
            await self.kick(wf.task_id)
        elif ended.boundary == "paused":
            pause = ended.pause or PauseRequest("", "", "")
            await self.events.emit(wf.task, "paused", "running", step=paused_at, run=wf.run,
                                   actor=pause.actor or SOURCE, tag=f"paused:{pause.control_id}",
                                   outputs={"control": "pause"}, reason=f"pause: {pause.reason}")
        elif ended.boundary in ("succeeded", "failed"):
            await self.finalise(wf.task, final)
        # "retry": the retry sweep starts the next attempt when its backoff is over

    async def finalise(self, task: OpsTask, final: FinalNotice) -> None:
        """After the journal's final state: locks, the final event, the parent's count.

        The journal kept `final` with the final state, so if this process dies part way the
        recovery sweep does it all again (`Recovery._announce`); each part is idempotent (the event
        keeps its id, a lock is released by its owner, a child counts once at its parent)."""
        with tracer.start_as_current_span("executor.task.end", attributes={
                **task_attributes(task), "task.state": final.state,
                "task.reason": short_text(final.reason)}):
            await self._finalise(task, final)

    async def _finalise(self, task: OpsTask, final: FinalNotice) -> None:
        await self.locks.release_task(task)
        crash_point("executor.before_final_event")
        # need_kind and kind ride along so the scheduler's breaker can count the outcome;
        # cause lets it leave out what is not an adjustment failure (agent rejections).
        outputs: dict[str, Any] = {"need_kind": task.need_kind, "kind": task.kind}
        if final.cause:
            outputs["cause"] = final.cause
        outputs.update(final.extra)
        await self.events.emit(task, final.state, final.previous, reason=final.reason,
                               outputs=outputs, actor=final.actor, run=final.run,
                               step=final.step, event_key=final.event_key)
        log.info("task %s %s: %s", task.task_id, final.state, final.reason)
        if task.parent_task_id is not None:
            await self._child_finished(task, final.state)
        await self.journal.announced(str(task.task_id))

    def kick_ms(self) -> int:
        """When a scheduled step must have started by, else the sweep starts it."""
        return epoch_ms(self.clock() + timedelta(seconds=self.settings.start_grace_s))


def succeeded(wf: Workflow) -> FinalNotice:
    """How a task whose last step ends now announces its success."""
    return FinalNotice("succeeded", "running", "every step completed", run=wf.run)

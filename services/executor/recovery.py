"""Recovery: deadlines, retries and a restart.

The deadline sweep finds steps past their deadline and recovers them: an agent's command
gets a status query (and, if the agent never got it, is sent once more under the same
command id); a centre action runs again under its command id. What cannot be recovered
fails as a timeout. The sweep also starts late scheduled steps and retries whose backoff
is over; the first sweep of a process asks about every command left without an answer.
A wait for an agent that spanned a broker outage is no timeout: it starts over
(services/executor/broker_health.py), so an outage never counts against a breaker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from functools import partial
from uuid import UUID

from common.clock import Clock, epoch_ms
from common.errors import INFRASTRUCTURE_ERRORS, PermanentError
from common.reportauth import WRONG_SENDER
from common.tracing import resumed_span
from schemas.events.v1 import CommandResult, Step
from services.executor.broker_health import UNREACHABLE, BrokerHealth
from services.executor.commands import (
    CommandSender,
    agent_action,
    answered_by_addressee,
    query_id_for,
)
from services.executor.events import TaskEvents
from services.executor.journal import Journal, Workflow
from services.executor.settings import ExecutorSettings
from services.executor.spans import tracer
from services.executor.workflow import WorkflowCore
from services.shared.locks import lock_ttl_s

log = logging.getLogger("clusterwarden.executor")


class Recovery:
    """Recovers overdue steps, runs due retries, and asks about unanswered commands."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, core: WorkflowCore,
                 commands: CommandSender, events: TaskEvents, clock: Clock,
                 broker: BrokerHealth) -> None:
        self.settings = settings
        self.broker = broker
        self.journal = journal
        self.core = core
        self.commands = commands
        self.events = events
        self.clock = clock
        # Process bookkeeping only (has this process run its startup recovery?); every
        # workflow fact is in Redis.
        self._recovered = False

    async def sweep_deadlines(self) -> None:
        """Overdue steps are recovered (status query, resend, re-run) or failed as timeouts;
        late scheduled steps are started; retries whose backoff is over run."""
        if not self._recovered:
            await self.recover()
            self._recovered = True
        now_ms = epoch_ms(self.clock())
        for task_id in await self.journal.overdue(now_ms):
            await self._guarded(task_id, "overdue", partial(self._overdue, task_id, now_ms))
        for task_id in await self.journal.due_retries(now_ms):
            await self._guarded(task_id, "retry", partial(self._retry_due, task_id))
        grace_ms = int(self.settings.outbox_grace_s * 1000)
        for task_id in await self.journal.unannounced(now_ms - grace_ms):
            await self._guarded(task_id, "announce", partial(self._announce, task_id))

    async def _announce(self, task_id: str) -> None:
        """A task the journal ended and whose end nobody announced: its executor died in
        between (or is slower than the grace, and the event then goes out twice, under one id)."""
        wf = await self.journal.load(task_id)
        if wf is None or wf.final is None:
            await self.journal.announced(task_id)  # expired, or announced meanwhile
            return
        log.warning("task %s ended %s without its announcement: announcing it now", task_id,
                    wf.final.state)
        await self.core.finalise(wf.task, wf.final)

    async def renew_locks(self) -> None:
        """Every running task's locks live on while it runs: their TTL is the task's worst
        case, and a task that outlives it (retries, slow steps) would let a second task act
        on its target. A lock another task took meanwhile is left to it; the task's next
        step is refused for it (`lock_lost`)."""
        for task_id in await self.journal.open_workflows():
            wf = await self.journal.load(task_id)
            if wf is None or wf.state != "running":
                continue  # a paused task takes its locks again when it is resumed
            held = await self.core.locks.acquire(task_id, wf.task.mutex_keys,
                                            lock_ttl_s(wf.task, self.settings.lock_margin_s))
            if held is not None:
                log.warning("task %s lost lock %s to task %s", task_id, held.lock, held.owner)

    async def _guarded(self, task_id: str, why: str,
                       work: Callable[[], Awaitable[None]]) -> None:
        """One workflow's failure must not stop the sweep of the others; Redis down does.
        The work is a span of the workflow's own trace (the sweep has no message)."""
        try:
            with resumed_span(tracer, f"executor.sweep.{why}",
                              await self.journal.trace_of(task_id),
                              attributes={"task.id": task_id}):
                await work()
        except UNREACHABLE:
            # A query or resend that could not be published: the wait it ends spans an outage.
            await self.broker.note_outage()
            raise
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception:
            log.exception("sweep of task %s failed", task_id)

    async def recover(self) -> None:
        """On startup: ask the agents about every command left without an answer."""
        for task_id in await self.journal.open_workflows():
            await self._guarded(task_id, "recover", partial(self._recover_one, task_id))

    async def _recover_one(self, task_id: str) -> None:
        wf = await self.journal.load(task_id)
        if wf is None or wf.state != "running":
            await self.journal.forget_timers(task_id)
        elif wf.step_state == "scheduled":
            await self.core.kick(task_id)
        elif (wf.step_state == "started" and not wf.query_id
              and not await self.core.runs_in_centre(wf)):
            await self.send_query(wf)
        # a started centre or backend step is re-run by its deadline (both are idempotent)

    async def _retry_due(self, task_id: str) -> None:
        if not await self.core.kick(task_id):
            await self.journal.forget_retry(task_id)

    async def _overdue(self, task_id: str, now_ms: int) -> None:
        wf = await self.journal.load(task_id)
        if wf is None or wf.state != "running":
            await self.journal.forget_timers(task_id)
            return
        if wf.step_state == "scheduled":
            await self.core.kick(task_id)
            return
        if wf.step_state != "started" or wf.deadline_ms > now_ms:
            return  # moved on, or its deadline was just extended
        step = wf.task.steps[wf.step]
        if await self.core.runs_in_centre(wf):
            await self._centre_overdue(wf, step, now_ms)
        elif wf.query_id:
            await self._unanswered(wf, self.settings.status_query_timeout_s,
                                   "timeout: no answer to the status query")
        elif not await self.send_query(wf):
            await self._unanswered(wf, step.timeout_s,
                                   f"timeout: no answer after {wf.queries} status queries")

    async def _unanswered(self, wf: Workflow, wait_s: float, reason: str) -> None:
        """A wait of `wait_s` for the agent ended without an answer: the attempt fails as a
        timeout, unless the broker was unreachable during the wait (the command, the answer
        or the query may be stuck in it): then the wait starts over, the query (if any)
        still outstanding. Raises InfrastructureUnavailable while the broker is down."""
        wait_ms = int(wait_s * 1000)
        if not await self.broker.unreachable_since(wf.deadline_ms - wait_ms):
            await self.core.step_failed(wf, "unknown", reason)
            return
        step = wf.task.steps[wf.step]
        deadline_ms = epoch_ms(self.clock()) + wait_ms
        if await self.journal.wait_again(wf, deadline_ms):
            log.warning("task %s step %s: the broker was unreachable during the wait for the "
                        "agent; waiting again", wf.task_id, step.name)
            await self.events.emit(
                wf.task, "running", "running", step=wf.step, step_state="started",
                command_id=UUID(wf.command_id), run=wf.run, tag=f"outage{deadline_ms}",
                reason=f"{step.name}: the broker was unreachable while waiting for the agent; "
                       f"waiting {wait_s:g} s more (an outage is not a timeout)")

    async def _centre_overdue(self, wf: Workflow, step: Step, now_ms: int) -> None:
        deadline_ms = now_ms + int(step.timeout_s * 1000)
        if wf.waiting:
            counts = await self.journal.child_counts(wf.task_id, wf.step)
            if counts.settled:  # the last child's notice was lost
                await self.core.children_settled(wf, counts, wf.waiting_outputs or {})
                return
            if wf.pause is not None:
                # The operator holds the task (and its children): waiting is not a timeout.
                await self.journal.extend_deadline(wf, deadline_ms)
                return
            if await self.journal.recovery_started(wf, "", deadline_ms, 1):
                # Once: run the action again (the centre answers with the same children) so
                # children lost between the journal and the bus are published again.
                await self.core.run_centre(replace(wf, queries=wf.queries + 1,
                                                   deadline_ms=deadline_ms))
                return
            # Open children are left to finish on their own: each holds its own locks and
            # deadlines; only the parent's wait is over.
            await self.core.step_failed(
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
            await self.core.run_centre(replace(wf, queries=wf.queries + 1,
                                               deadline_ms=deadline_ms))
            return
        await self.core.step_failed(wf, "unknown", "timeout: the centre action did not finish")

    async def send_query(self, wf: Workflow) -> bool:
        """Ask the agent what became of the step's command (once per deadline)."""
        step = wf.task.steps[wf.step]
        action = agent_action(step)
        if action is None:
            return False
        query_id = query_id_for(wf.command_id, wf.queries)
        now = self.clock()
        timeout_s = self.settings.status_query_timeout_s
        if not await self.journal.recovery_started(
                wf, str(query_id), epoch_ms(now + timedelta(seconds=timeout_s)),
                self.settings.max_status_queries):
            return False
        await self.commands.query(wf, action, query_id, now)
        await self.events.emit(
            wf.task, "running", "running", step=wf.step, step_state="started",
            command_id=UUID(wf.command_id), run=wf.run, tag=f"query{wf.queries}",
            reason=f"{step.name}: no answer yet; asked the agent for the status "
                   f"of its command (query {wf.queries + 1})")
        return True

    async def on_query_answer(self, task_id: str, result: CommandResult) -> None:
        """The agent's answer about a command that got no answer in time."""
        wf = await self.journal.load(task_id)
        if (wf is None or wf.state != "running" or wf.step_state != "started"
                or wf.query_id != str(result.command_id)):
            return
        if (refused := answered_by_addressee(wf, result)) is not None:
            raise PermanentError(WRONG_SENDER, refused)
        step = wf.task.steps[wf.step]
        queried = result.outputs.get("queried_command_id")
        if result.outcome == "unknown" and result.reason == "not_in_journal":
            deadline_ms = epoch_ms(self.clock() + timedelta(seconds=step.timeout_s))
            if wf.resent == 0 and await self.journal.query_answered(wf, deadline_ms,
                                                                    resend=True):
                await self.events.emit(wf.task, "running", "running", step=wf.step,
                                       step_state="started", command_id=UUID(wf.command_id),
                                       run=wf.run, tag="resent",
                                       reason=f"{step.name}: the agent never got the command; "
                                              "sent again with the same command id")
                await self.commands.send(wf)
                return
            await self.core.step_failed(wf, "unknown", "timeout: the agent never got the command")
        elif result.outcome == "unknown" and result.reason == "in_progress":
            deadline_ms = epoch_ms(self.clock() + timedelta(seconds=step.timeout_s))
            if await self.journal.query_answered(wf, deadline_ms, resend=False):
                await self.events.emit(wf.task, "running", "running", step=wf.step,
                                       step_state="started", command_id=UUID(wf.command_id),
                                       run=wf.run, tag=f"extended{wf.queries}",
                                       reason=f"{step.name}: still in progress on the agent; "
                                              f"deadline extended by {step.timeout_s:g} s")
        elif queried != wf.command_id or result.outcome == "unknown":
            # The query itself was refused (expired, clock skew...): the command's fate is
            # still unknown, which counts as a timeout.
            await self.core.step_failed(wf, "unknown",
                                        f"timeout: status query {result.outcome} {result.reason}")
        else:
            outputs = {k: v for k, v in result.outputs.items() if not k.startswith("queried_")}
            await self.core.settle(wf, result.outcome, result.reason, outputs)

"""The executor's signed commands to agents: a step's command, a status query, a cancel.

Ids are derived, never random: the same step attempt always has the same command id (agents
dedupe on it), and so do its status queries and its cancel. Deciding when to send is the
workflow's and recovery's; this module only builds, signs and publishes.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from uuid import UUID, uuid5

from opentelemetry import trace

from common.clock import Clock
from common.signing import CommandSigner
from schemas import ids
from schemas.events.v1 import (
    Action,
    AddCapacity,
    Cancel,
    CommandPayload,
    CommandResult,
    MigrateJobs,
    QueryStatus,
    ReleaseNode,
    RemoveCapacity,
    RestartAgent,
    Step,
)
from schemas.topics import Topic
from services.executor.events import SOURCE
from services.executor.journal import Journal, Workflow
from services.executor.ports import Publisher
from services.executor.settings import ExecutorSettings

log = logging.getLogger("clusterwarden.executor")
_tracer = trace.get_tracer("clusterwarden.executor")
_CENTRE_TYPES = (AddCapacity, RemoveCapacity, MigrateJobs, ReleaseNode, RestartAgent)


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


def answered_by_addressee(wf: Workflow, result: CommandResult) -> str | None:
    """Why `result` is not an answer of the node the step's command went to, or None if it
    is. The answer's MAC shows which node sent it (common/reportauth.py); this shows that
    node is the one asked, so one node's key cannot answer for another's drain."""
    action = agent_action(wf.task.steps[wf.step])
    if action is None:
        return f"step {wf.step} of task {wf.task_id} sends no command"
    if (result.cluster_id, result.node_id) != (wf.task.cluster_id, action.node_id):
        return (f"answer from {result.cluster_id}/{result.node_id} to a command sent to "
                f"{wf.task.cluster_id}/{action.node_id}")
    return None


class CommandSender:
    """Builds, signs and publishes the commands of a workflow's current step."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, signer: CommandSigner,
                 bus: Publisher, clock: Clock) -> None:
        self.settings = settings
        self.journal = journal
        self.signer = signer
        self.bus = bus
        self.clock = clock

    async def send(self, wf: Workflow) -> None:
        """Send the step's command (again, with the same command id, when resending)."""
        step = wf.task.steps[wf.step]
        action = agent_action(step)
        if action is None:
            raise TypeError(f"step {step.name} is a centre action, not a command")
        now = self.clock()
        ttl = min(self.settings.command_ttl_s, step.timeout_s)
        cluster = wf.task.cluster_id
        await self._publish(wf, CommandPayload.for_action(
            action, cluster_id=cluster, command_id=UUID(wf.command_id),
            seq=await self.journal.next_command_seq(cluster, action.node_id, now),
            epoch=wf.epoch,
            issued_at=now, expires_at=now + timedelta(seconds=ttl),
            task_id=wf.task.task_id, step_index=wf.step, dry_run=wf.task.dry_run,
        ))
        if self.settings.crash_at == f"after_send:{action.action}":
            # Fault injection for tests: die as a kill -9 would, before the step's result.
            log.critical("crash_at %s: exiting now", self.settings.crash_at)
            os._exit(137)

    async def query(self, wf: Workflow, action: Action, query_id: UUID, now: datetime) -> None:
        """Ask the agent of `action` what became of the step's command."""
        timeout_s = self.settings.status_query_timeout_s
        await self._publish(wf, CommandPayload.for_action(
            QueryStatus(node_id=action.node_id, command_id=UUID(wf.command_id)),
            cluster_id=wf.task.cluster_id, command_id=query_id, epoch=wf.epoch, issued_at=now,
            expires_at=now + timedelta(
                seconds=min(self.settings.command_ttl_s, max(timeout_s, 1.0))),
            task_id=wf.task.task_id, step_index=wf.step,
        ))

    async def cancel(self, wf: Workflow) -> None:
        """Ask the agent to cancel the step's running command (terminate)."""
        action = agent_action(wf.task.steps[wf.step])
        if action is None or wf.step_state != "started" or not wf.command_id:
            return
        cancel_id = cancel_id_for(wf.command_id)
        await self.journal.index_cancel(str(cancel_id), wf.task_id)
        now, cluster = self.clock(), wf.task.cluster_id
        await self._publish(wf, CommandPayload.for_action(
            Cancel(node_id=action.node_id, command_id=UUID(wf.command_id)), cluster_id=cluster,
            command_id=cancel_id,
            seq=await self.journal.next_command_seq(cluster, action.node_id, self.clock()),
            epoch=wf.epoch, issued_at=now,
            expires_at=now + timedelta(seconds=self.settings.command_ttl_s),
            task_id=wf.task.task_id, step_index=wf.step, dry_run=wf.task.dry_run,
        ))

    async def _publish(self, wf: Workflow, payload: CommandPayload) -> None:
        # Its own span, so the trace names the command the agent's execution answers.
        with _tracer.start_as_current_span("executor.command", kind=trace.SpanKind.PRODUCER,
                                           attributes={
                "command.id": str(payload.command_id), "command.action": payload.action.action,
                "node.id": payload.node_id, "cluster.id": payload.cluster_id,
                "task.id": wf.task_id, "step.index": wf.step, "task.epoch": wf.epoch}):
            await self.bus.publish(
                Topic.NODE_COMMANDS, self.signer.sign(payload, SOURCE))

"""Executor handlers: a scheduled task starts a workflow; results and deadlines advance it."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from redis.asyncio import Redis

from schemas.events.v1 import (
    CommandPayload,
    CommandResult,
    OpsTask,
    StepState,
    TaskEvent,
    TaskScheduled,
    TaskState,
    now_utc,
)
from schemas.topics import Topic
from services.executor.journal import Journal, Workflow
from services.executor.settings import ExecutorSettings
from services.scheduler.queue import release_locks
from services.shared.messaging import EventBus
from services.shared.redis_client import Keys
from services.shared.signing import CommandSigner

log = logging.getLogger("clusterwarden.executor")
SOURCE = "executor"
_IDS = uuid5(NAMESPACE_URL, "clusterwarden/executor")

# A rejection is the agent refusing on principle (expired, stale epoch, wrong audience):
# sending the same thing again cannot help, so it is not retried.
RETRYABLE_OUTCOMES = frozenset({"failed", "unknown"})


def command_id_for(task_id: UUID, step: int, attempt: int) -> UUID:
    """The same step attempt always has the same command id (agents dedupe on it)."""
    return uuid5(_IDS, f"{task_id}:{step}:{attempt}")


class Executor:
    """Drives workflows one step at a time; all progress lives in the Redis journal."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, signer: CommandSigner,
                 bus: EventBus, redis: Redis, keys: Keys) -> None:
        self.settings = settings
        self.journal = journal
        self.signer = signer
        self.bus = bus
        self.redis = redis
        self.keys = keys

    async def on_scheduled(self, scheduled: TaskScheduled) -> None:
        task = scheduled.task
        outcome = await self.journal.start(task, scheduled.epoch)
        if outcome == "stale":
            log.info("task %s epoch %d is not newer; ignored", task.task_id, scheduled.epoch)
            return
        if outcome == "takeover":
            log.warning("task %s taken over with epoch %d", task.task_id, scheduled.epoch)
            return  # the running workflow goes on; its deadline sweep covers a lost command
        await self.emit(task, "running", "dispatched", reason=f"epoch {scheduled.epoch}")
        await self.start_step(task, 0, 0, scheduled.epoch)

    async def start_step(self, task: OpsTask, index: int, attempt: int, epoch: int) -> None:
        step = task.steps[index]
        now = now_utc()
        command_id = command_id_for(task.task_id, index, attempt)
        ttl = min(self.settings.command_ttl_s, step.timeout_s)
        deadline_ms = int((now + timedelta(seconds=step.timeout_s)).timestamp() * 1000)
        if not await self.journal.step_started(str(task.task_id), index, attempt,
                                               str(command_id), deadline_ms):
            return  # the workflow moved on (another delivery got here first)
        payload = CommandPayload(
            command_id=command_id,
            node_id=step.action.node_id,
            seq=await self.journal.next_command_seq(step.action.node_id),
            epoch=epoch,
            issued_at=now,
            expires_at=now + timedelta(seconds=ttl),
            task_id=task.task_id,
            step_index=index,
            dry_run=task.dry_run,
            action=step.action,
        )
        await self.emit(task, "running", "running", step=index, step_state="started",
                        command_id=command_id,
                        reason=f"{step.name}: {step.action.action} attempt {attempt + 1}")
        await self.bus.publish(
            Topic.NODE_COMMANDS, self.signer.sign(payload, task.cluster_id, SOURCE)
        )

    async def on_result(self, result: CommandResult) -> None:
        task_id = await self.journal.task_of_command(str(result.command_id))
        if task_id is None:
            return  # not a command of ours (or its index expired)
        wf = await self.journal.load(task_id)
        if wf is None or wf.command_id != str(result.command_id):
            return  # a late answer to an attempt already given up on
        if result.outcome == "succeeded":
            await self.step_succeeded(wf, dict(result.outputs))
        else:
            await self.step_failed(wf, result.outcome, result.reason or result.outcome)

    async def step_succeeded(self, wf: Workflow, outputs: dict[str, Any]) -> None:
        task, index = wf.task, wf.step
        last = index == len(task.steps) - 1
        if not await self.journal.step_ended(str(task.task_id), wf.command_id, "completed",
                                             outputs, None if last else index + 1):
            return
        await self.emit(task, "running", "running", step=index, step_state="completed",
                        command_id=UUID(wf.command_id), outputs=outputs,
                        reason=f"{task.steps[index].name} completed")
        if last:
            await self.finish(task, "succeeded", "every step completed")
        else:
            await self.start_step(task, index + 1, 0, wf.epoch)

    async def step_failed(self, wf: Workflow, outcome: str, reason: str) -> None:
        task, index = wf.task, wf.step
        if not await self.journal.step_ended(str(task.task_id), wf.command_id, "failed", {},
                                             None):
            return
        step = task.steps[index]
        await self.emit(task, "running", "running", step=index, step_state="failed",
                        command_id=UUID(wf.command_id),
                        reason=f"{step.name} attempt {wf.attempt + 1}: {outcome} {reason}")
        if outcome in RETRYABLE_OUTCOMES and wf.attempt + 1 < step.max_attempts:
            await self.start_step(task, index, wf.attempt + 1, wf.epoch)
        else:
            await self.finish(task, "failed", f"step {step.name}: {outcome} {reason}")

    async def sweep_deadlines(self) -> None:
        """Steps whose command got no answer in time fail as `timeout` (then retry or fail)."""
        now_ms = int(now_utc().timestamp() * 1000)
        for task_id in await self.journal.overdue(now_ms):
            wf = await self.journal.load(task_id)
            if wf is not None and wf.state == "running" and wf.step_state == "started":
                await self.step_failed(wf, "unknown", "timeout: no answer before the deadline")

    async def finish(self, task: OpsTask, state: TaskState, reason: str) -> None:
        if not await self.journal.finish(str(task.task_id), state, reason):
            return
        await release_locks(self.redis, self.keys, str(task.task_id), task.mutex_keys)
        # The need kind rides along so the scheduler's breaker can count the outcome.
        await self.emit(task, state, "running", reason=reason,
                        outputs={"need_kind": task.need_kind})
        log.info("task %s %s: %s", task.task_id, state, reason)

    async def emit(self, task: OpsTask, state: TaskState, previous: TaskState, *,
                   reason: str, step: int | None = None, step_state: StepState | None = None,
                   command_id: UUID | None = None, outputs: dict[str, Any] | None = None) -> None:
        discriminator = f"{state}:{step}:{step_state}:{command_id}"
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS,
            TaskEvent(
                event_id=uuid5(_IDS, f"{task.task_id}:{discriminator}"),
                source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
                subject=str(task.task_id), correlation_id=str(task.need_id),
                task_id=task.task_id, parent_task_id=task.parent_task_id,
                state=state, previous_state=previous, step_index=step, step_state=step_state,
                command_id=command_id, actor=SOURCE, reason=reason[:256],
                outputs=outputs or {},
            ),
        )

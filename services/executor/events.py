"""The executor's announcements: every transition of a workflow as a TaskEvent.

The same transition always gets the same event id, so a step taken again after a crash or
a duplicate delivery announces nothing new to the task store.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid5

from common.clock import Clock
from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import OpsTask, StepState, TaskControl, TaskEvent, TaskState
from schemas.topics import Topic
from services.executor.ports import Publisher

SOURCE = "executor"
MAX_OUTPUTS = 32  # the schema's bound on TaskEvent.outputs


def bounded(outputs: dict[str, Any]) -> dict[str, Any]:
    return dict(list(outputs.items())[:MAX_OUTPUTS])


class TaskEvents:
    """Publishes the executor's TaskEvents (and hands child tasks over)."""

    def __init__(self, bus: Publisher, clock: Clock) -> None:
        self.bus = bus
        self.clock = clock

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
                outputs=bounded(outputs or {}),
            ),
        )

    async def hand_over_child(self, parent: OpsTask, index: int, step_name: str,
                              child: OpsTask) -> None:
        """Announce a child task, then publish it for the scheduler."""
        # `created` first: the task store must know a task before any later transition.
        await self.bus.publish(Topic.OPS_TASK_EVENTS, TaskEvent(
            event_id=uuid5(ids.EXECUTOR, f"{child.task_id}:created"),
            source=SOURCE, occurred_at=self.clock(), cluster_id=child.cluster_id,
            subject=str(child.task_id), correlation_id=str(child.need_id),
            task_id=child.task_id, parent_task_id=child.parent_task_id, state="created",
            actor=SOURCE, task=child,
            reason=f"child of task {parent.task_id} step {index} ({step_name})",
        ))
        await self.bus.publish(Topic.OPS_TASKS, child)

    async def control_unseen(self, control: TaskControl, task_id: UUID, control_id: str,
                             state: TaskState, reason: str, *, refused: bool,
                             extra: dict[str, Any] | None = None) -> None:
        """A control for a task not received yet: refused, or kept until it arrives."""
        outputs: dict[str, Any] = {"control": control.action, **(extra or {})}
        if refused:
            outputs["refused"] = True
        else:
            outputs["pending"] = True
        await self.bus.publish(Topic.OPS_TASK_EVENTS, TaskEvent(
            event_id=uuid5(ids.EXECUTOR, f"control:{control_id}"), source=SOURCE,
            occurred_at=self.clock(), cluster_id=control.cluster_id, subject=str(task_id),
            correlation_id=control.correlation_id, task_id=task_id, state=state,
            previous_state=state, actor=control.actor, reason=short_text(reason),
            outputs=outputs,
        ))

"""The scheduler's task transitions: one constructor, so every transition it publishes (queued,
held, dispatched, failed by a relation) has an id that is the same if it is replayed."""

from __future__ import annotations

from datetime import datetime
from uuid import uuid5

from schemas import ids
from schemas.events.v1 import OpsTask, OutputValue, TaskEvent, TaskState

SOURCE = "scheduler"


def task_event(task: OpsTask, state: TaskState, previous: TaskState | None, reason: str,
               at: datetime, discriminator: str = "",
               outputs: dict[str, OutputValue] | None = None) -> TaskEvent:
    """A transition of `task` at `at`, with an id that is the same if it is replayed."""
    return TaskEvent(
        event_id=uuid5(ids.TASK_EVENTS, f"{task.task_id}:{state}:{discriminator}"),
        source=SOURCE, occurred_at=at, cluster_id=task.cluster_id,
        subject=str(task.task_id), correlation_id=str(task.need_id),
        task_id=task.task_id, parent_task_id=task.parent_task_id,
        state=state, previous_state=previous, actor=SOURCE, reason=reason,
        outputs=outputs or {},
    )

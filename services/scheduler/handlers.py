"""Scheduler handlers: tasks in, queued; a dispatcher loop hands them to the executor."""

from __future__ import annotations

import logging
from uuid import NAMESPACE_URL, uuid5

from schemas.events.v1 import OpsTask, TaskEvent, TaskScheduled, TaskState, now_utc
from schemas.topics import Topic
from services.scheduler import policy
from services.scheduler.queue import TaskQueue
from services.scheduler.settings import SchedulerSettings
from services.shared.messaging import EventBus

log = logging.getLogger("clusterwarden.scheduler")
SOURCE = "scheduler"
_IDS = uuid5(NAMESPACE_URL, "clusterwarden/task-events")


def task_event(task: OpsTask, state: TaskState, previous: TaskState | None, reason: str,
               discriminator: str = "") -> TaskEvent:
    """A transition of `task`, with an id that is the same if the transition is replayed."""
    return TaskEvent(
        event_id=uuid5(_IDS, f"{task.task_id}:{state}:{discriminator}"),
        source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
        subject=str(task.task_id), correlation_id=str(task.need_id),
        task_id=task.task_id, parent_task_id=task.parent_task_id,
        state=state, previous_state=previous, actor=SOURCE, reason=reason,
    )


class Scheduler:
    """Queues every task once and dispatches the most urgent task whose targets are free."""

    def __init__(self, settings: SchedulerSettings, queue: TaskQueue, bus: EventBus) -> None:
        self.settings = settings
        self.queue = queue
        self.bus = bus

    async def on_task(self, task: OpsTask) -> None:
        new = await self.queue.enqueue(
            task, policy.queue_score(task), policy.lock_ttl_s(task, self.settings.lock_margin_s)
        )
        # Published even for a redelivered task: its id is fixed, so consumers dedupe it, and a
        # crash between the enqueue and this publish cannot lose the transition.
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS, task_event(task, "queued", "created", "queued by priority")
        )
        if new:
            log.info("queued task %s (priority %s)", task.task_id, task.priority)

    async def dispatch(self) -> None:
        """One dispatcher tick: requeue expired leases, then dispatch what can run."""
        now_ms = int(now_utc().timestamp() * 1000)
        if reaped := await self.queue.reap(now_ms):
            log.warning("requeued %d task(s) whose dispatcher did not finish", reaped)
        lease_ms = int(self.settings.lease_s * 1000)
        for _ in range(100):
            claimed = await self.queue.claim(now_ms, lease_ms, self.settings.scan_limit)
            if claimed is None:
                return
            task = claimed.task
            epoch = await self.queue.next_epoch()
            # The transition first: once the executor has the task it publishes `running`,
            # and the task's events must arrive in the order they happened.
            await self.bus.publish(
                Topic.OPS_TASK_EVENTS,
                task_event(task, "dispatched", "queued", f"locks {task.mutex_keys} held; "
                           f"epoch {epoch}", str(epoch)),
            )
            await self.bus.publish(
                Topic.OPS_TASKS_SCHEDULED,
                TaskScheduled(
                    event_id=uuid5(_IDS, f"{task.task_id}:scheduled:{epoch}"),
                    source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
                    subject=str(task.task_id), correlation_id=str(task.need_id),
                    task=task, epoch=epoch,
                ),
            )
            await self.queue.ack(str(task.task_id))
            log.info("dispatched task %s with epoch %d", task.task_id, epoch)

"""Task histories for the API's tests: a task brought to a given state by the events the
templater, scheduler and executor would publish about it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4

from schemas.events.v1 import (
    AddCapacity,
    DrainNode,
    Evidence,
    MigrateJobs,
    OfflineNode,
    OpsTask,
    Step,
    StepState,
    TaskEvent,
    TaskState,
)

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
Ending = Literal["queued", "running", "paused", "failed", "succeeded", "pause_requested",
                 "terminated"]


def offline_task(node: str = "node-002", cluster: str = "c1", pool: str = "default",
                 parent: UUID | None = None, start: datetime = START) -> OpsTask:
    """An offline task of four steps (drain, offline, add capacity, migrate)."""
    task_id = uuid4()
    return OpsTask(
        event_id=uuid4(), source="templater", occurred_at=start, cluster_id=cluster,
        subject=str(task_id), task_id=task_id, parent_task_id=parent, need_id=uuid4(),
        need_kind="offline", template="offline.v2", pool=pool, target=node, priority=1,
        mutex_keys=[f"node.{node}"],
        steps=[Step(index=0, name="drain", action=DrainNode(node_id=node)),
               Step(index=1, name="offline", action=OfflineNode(node_id=node)),
               Step(index=2, name="add-capacity", action=AddCapacity(pool=pool),
                    guard="pool_above_range"),
               Step(index=3, name="migrate-jobs", action=MigrateJobs(pool=pool, node_id=node),
                    guard="node_has_jobs")],
        evidence=[Evidence(metric="node_fault_count", value=1.0, range_low=0.0, range_high=0.0,
                           observed_at=start, detail="xid 79 on gpu 0: replace")],
    )


def history(task: OpsTask, ending: Ending) -> list[TaskEvent]:
    """The events that bring `task` to `ending` (running: its step 1 started)."""
    clock = iter(task.occurred_at + timedelta(seconds=s) for s in range(1, 1_000))
    events: list[TaskEvent] = []

    def add(state: TaskState, previous: TaskState | None, actor: str, reason: str,
            step: int | None = None, step_state: StepState | None = None,
            outputs: dict[str, Any] | None = None, created: bool = False) -> None:
        events.append(TaskEvent(
            event_id=uuid4(), source=actor, occurred_at=next(clock),
            cluster_id=task.cluster_id, subject=str(task.task_id), task_id=task.task_id,
            parent_task_id=task.parent_task_id, state=state, previous_state=previous,
            step_index=step, step_state=step_state,
            command_id=uuid4() if step_state == "started" else None, actor=actor,
            reason=reason, outputs=outputs or {}, task=task if created else None))

    add("created", None, "templater", "need offline via template offline.v2", created=True)
    add("queued", "created", "scheduler", "queued at priority 1")
    if ending == "queued":
        return events
    add("dispatched", "queued", "scheduler", "locks held; epoch 1")
    add("running", "dispatched", "executor", "epoch 1")
    add("running", "running", "executor", "drain attempt 1", 0, "started")
    add("running", "running", "executor", "drain completed", 0, "completed",
        {"mode": "draining"})
    add("running", "running", "executor", "offline attempt 1", 1, "started")
    if ending == "running":
        return events
    if ending == "pause_requested":
        add("running", "running", "alice", "pause: look first (pauses when the running step "
            "ends)", 1, outputs={"control": "pause"})
        return events
    if ending == "paused":
        add("running", "running", "executor", "offline completed", 1, "completed")
        add("paused", "running", "alice", "pause: look first (paused before its next step)", 2,
            outputs={"control": "pause"})
        return events
    if ending == "failed":
        add("running", "running", "executor", "offline failed: not_drained", 1, "failed")
        add("failed", "running", "executor", "step offline failed: not_drained",
            outputs={"cause": "failed"})
        return events
    if ending == "terminated":
        add("terminated", "running", "bob", "terminate: wrong node",
            outputs={"cause": "terminated", "control": "terminate"})
        return events
    add("running", "running", "executor", "offline completed", 1, "completed")
    add("running", "running", "executor", "add-capacity skipped: guard does not hold", 2,
        "skipped")
    add("running", "running", "executor", "migrate-jobs skipped", 3, "skipped")
    add("succeeded", "running", "executor", "every step completed")
    return events

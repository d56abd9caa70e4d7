"""A realistic task history for the store's tests: a scale-in task whose remove-capacity step
runs one child task (drain with a retried attempt, a skipped step, release).

Event ids are derived from the task and the transition, as the services derive theirs, so
building the same story twice gives the same events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid5

from schemas.events.v1 import (
    DrainNode,
    Evidence,
    MigrateJobs,
    OpsTask,
    ReleaseNode,
    RemoveCapacity,
    Step,
    StepState,
    TaskEvent,
    TaskState,
)

BASE = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
_IDS = UUID("6a1f4f3e-8a53-4c1e-9d55-3c1b6e0f5a10")

# What the executor records of the capacity change (services/executor/planning.py).
RESOURCES: dict[str, Any] = {
    "direction": "in", "initial_nodes": 3, "initial_gpus": 24, "initial_util_pct": 12.5,
    "target_nodes": 2, "target_gpus": 16, "target_util_pct": 18.8,
}


@dataclass
class Story:
    """The two tasks and every event about them, in the order they happened."""

    parent: OpsTask
    child: OpsTask
    events: list[TaskEvent] = field(default_factory=list)
    commands: dict[str, UUID] = field(default_factory=dict)


def scale_in_story(cluster: str = "c1", node: str = "node-003", pool: str = "default",
                   start: datetime = BASE, tag: str = "") -> Story:
    """A scale-in of `pool` in `cluster` that removes `node`, starting at `start`."""
    key = f"{cluster}:{pool}:{node}:{start.isoformat()}:{tag}"
    parent_id, child_id = uuid5(_IDS, f"{key}:parent"), uuid5(_IDS, f"{key}:child")
    need_id = uuid5(_IDS, f"{key}:need")
    evidence = [Evidence(metric="pool_gpu_utilization_pct", value=12.5, range_low=30.0,
                         range_high=80.0, observed_at=start - timedelta(minutes=1),
                         detail="below its range for 10 minutes")]
    parent = OpsTask(
        event_id=uuid5(_IDS, f"{key}:parent:task"), source="templater", occurred_at=start,
        cluster_id=cluster, subject=str(parent_id), correlation_id=str(need_id),
        task_id=parent_id, need_id=need_id, need_kind="scale_in", template="scale_in.v1",
        pool=pool, target=pool, priority=6, mutex_keys=[f"pool.{cluster}.{pool}"],
        steps=[
            Step(index=0, name="remove-capacity", action=RemoveCapacity(pool=pool),
                 timeout_s=900.0, max_attempts=2),
            Step(index=1, name="rebalance", action=MigrateJobs(pool=pool, max_jobs=8),
                 guard="nodes_out_of_range", timeout_s=900.0, max_attempts=2),
        ],
        evidence=evidence,
    )
    child = OpsTask(
        event_id=uuid5(_IDS, f"{key}:child:task"), source="executor",
        occurred_at=start + timedelta(seconds=6), cluster_id=cluster, subject=node,
        correlation_id=str(parent_id), task_id=child_id, parent_task_id=parent_id,
        need_id=need_id, need_kind="scale_in", template="scale_in.v1.remove",
        action_type="remove_node", pool=pool, target=node, priority=6,
        mutex_keys=[f"node.{node}"],
        steps=[
            Step(index=0, name="drain", action=DrainNode(node_id=node), timeout_s=30.0),
            Step(index=1, name="migrate-jobs",
                 action=MigrateJobs(pool=pool, node_id=node, max_jobs=64),
                 guard="node_has_jobs", timeout_s=600.0),
            Step(index=2, name="release", action=ReleaseNode(node_id=node), timeout_s=60.0),
        ],
        evidence=evidence,
    )
    story = Story(parent, child)
    cmd = story.commands
    for name in ("parent0", "child0a", "child0b", "child2"):
        cmd[name] = uuid5(_IDS, f"{key}:command:{name}")
    clock = iter(start + timedelta(seconds=s) for s in range(1_000))

    def add(task: OpsTask, label: str, state: TaskState, previous: TaskState | None,
            actor: str, reason: str, *, step: int | None = None,
            step_state: StepState | None = None, command: UUID | None = None,
            outputs: dict[str, Any] | None = None, created: bool = False) -> None:
        story.events.append(TaskEvent(
            event_id=uuid5(_IDS, f"{task.task_id}:{label}"), source=actor,
            occurred_at=next(clock), cluster_id=cluster, subject=str(task.task_id),
            correlation_id=str(task.need_id), task_id=task.task_id,
            parent_task_id=task.parent_task_id, state=state, previous_state=previous,
            step_index=step, step_state=step_state, command_id=command, actor=actor,
            reason=reason, outputs=outputs or {}, task=task if created else None))

    p, c = parent, child
    add(p, "created", "created", None, "templater",
        f"need scale_in for {pool} via template scale_in.v1", created=True)
    add(p, "queued", "queued", "created", "scheduler", "queued at priority 6")
    add(p, "dispatched", "dispatched", "queued", "scheduler", "dispatched with epoch 1")
    add(p, "running", "running", "dispatched", "executor", "epoch 1")
    add(p, "s0-started", "running", "running", "executor",
        "remove-capacity: remove_capacity attempt 1", step=0, step_state="started",
        command=cmd["parent0"])
    add(p, "s0-waiting", "running", "running", "executor",
        "remove-capacity: waiting for 1 child task(s)", step=0, step_state="started",
        command=cmd["parent0"], outputs={**RESOURCES, "nodes": node, "children": 1})
    add(c, "created", "created", None, "executor",
        f"child of task {parent_id} step 0 (remove-capacity)", created=True)
    add(c, "queued", "queued", "created", "scheduler", "queued at priority 6")
    add(c, "dispatched", "dispatched", "queued", "scheduler", "dispatched with epoch 2")
    add(c, "running", "running", "dispatched", "executor", "epoch 2")
    add(c, "s0-started-a", "running", "running", "executor", "drain: drain_node attempt 1",
        step=0, step_state="started", command=cmd["child0a"])
    add(c, "s0-failed-a", "running", "running", "executor",
        "drain attempt 1: unknown timeout; retry in 1 s", step=0, step_state="failed",
        command=cmd["child0a"], outputs={"cause": "timeout", "permanent": False})
    add(c, "s0-started-b", "running", "running", "executor", "drain: drain_node attempt 2",
        step=0, step_state="started", command=cmd["child0b"])
    add(c, "s0-completed", "running", "running", "executor", "drain completed", step=0,
        step_state="completed", command=cmd["child0b"],
        outputs={"mode": "draining", "jobs": 0})
    add(c, "s1-skipped", "running", "running", "executor",
        "migrate-jobs skipped: guard node_has_jobs does not hold: no jobs", step=1,
        step_state="skipped",
        outputs={"skipped": True, "guard": "node_has_jobs", "reason": "no jobs"})
    add(c, "s2-started", "running", "running", "executor", "release: release_node attempt 1",
        step=2, step_state="started", command=cmd["child2"])
    add(c, "s2-completed", "running", "running", "executor", "release completed", step=2,
        step_state="completed", command=cmd["child2"],
        outputs={"released": node, "provider": "local"})
    add(c, "succeeded", "succeeded", "running", "executor", "every step completed",
        outputs={"need_kind": "scale_in", "kind": "remove_node"})
    add(p, "s0-completed", "running", "running", "executor", "remove-capacity completed",
        step=0, step_state="completed", command=cmd["parent0"],
        outputs={**RESOURCES, "nodes": node, "children": 1, "succeeded": 1, "failed": 0})
    add(p, "s1-skipped", "running", "running", "executor",
        "rebalance skipped: guard nodes_out_of_range does not hold", step=1,
        step_state="skipped", outputs={"skipped": True, "guard": "nodes_out_of_range",
                                       "reason": "every node in range"})
    add(p, "succeeded", "succeeded", "running", "executor", "every step completed",
        outputs={"need_kind": "scale_in", "kind": "scale_in"})
    return story

"""The recorder: applies each TaskEvent to the store, once.

Every event becomes a row of `transitions`, unique by event id: a replayed event finds its id
taken and changes nothing. A transition for a task the store does not know yet (its
`created` event is late, or on another partition) makes a stub task that `created` fills in.
The task's row and its steps' rows are then derived again from the task's whole log
(services/store/projection.py), under a lock on the task's row, so two deliveries of events of
one task never interleave their derivations.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events.v1 import OpsTask, TaskEvent
from services.store.db import Store, fail_closed
from services.store.models import StepRecord, Task, Transition
from services.store.projection import Fact, planned_steps, restarted, step_views, task_view
from services.store.task_metrics import TaskMetrics

log = logging.getLogger("clusterwarden.store.recorder")


def _insert(session: AsyncSession,
            table: type[Task] | type[Transition]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that can skip rows whose key exists (ON CONFLICT DO NOTHING)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the task store supports SQLite and PostgreSQL, not {dialect}")


async def record_event(session: AsyncSession, event: TaskEvent) -> bool:
    """Apply `event` in `session`'s transaction; False if it was recorded before."""
    stub = _insert(session, Task).values(
        task_id=event.task_id, parent_task_id=event.parent_task_id,
        cluster_id=event.cluster_id, dry_run=False, state=event.state, reason=event.reason,
        evidence=[], created_at=event.occurred_at, updated_at=event.occurred_at,
    ).on_conflict_do_nothing(index_elements=["task_id"])
    await session.execute(stub)
    # The row lock serialises every delivery about this task (PostgreSQL; SQLite has a
    # single writer anyway and renders no FOR UPDATE).
    task = (await session.execute(
        select(Task).where(Task.task_id == event.task_id).with_for_update()
    )).scalar_one()

    inserted = await session.execute(
        _insert(session, Transition).values(
            event_id=event.event_id, task_id=event.task_id, occurred_at=event.occurred_at,
            state=event.state, previous_state=event.previous_state,
            step_index=event.step_index, step_state=event.step_state,
            command_id=event.command_id, actor=event.actor, reason=event.reason,
            outputs=dict(event.outputs),
        ).on_conflict_do_nothing(index_elements=["event_id"]).returning(Transition.id)
    )
    if inserted.scalar_one_or_none() is None:
        return False

    steps = {s.index: s for s in (await session.execute(
        select(StepRecord).where(StepRecord.task_id == event.task_id))).scalars()}
    if event.task is not None:
        _fill_plan(session, task, event.task, steps)
    if task.parent_task_id is None and event.parent_task_id is not None:
        task.parent_task_id = event.parent_task_id

    rows = (await session.execute(
        select(Transition).where(Transition.task_id == event.task_id))).scalars().all()
    facts = [Fact(seq=r.id, occurred_at=r.occurred_at, state=r.state,
                  previous_state=r.previous_state, step_index=r.step_index,
                  step_state=r.step_state, command_id=r.command_id, reason=r.reason,
                  outputs=r.outputs) for r in rows]
    view = task_view(facts)
    task.state, task.reason = view.state, view.reason
    task.created_at, task.updated_at = view.created_at, view.updated_at
    task.finished_at, task.current_step = view.finished_at, view.current_step
    views = step_views(facts)
    if restarted(facts):
        # Steps the latest run has not reached are pending again.
        for index in steps.keys() - views.keys():
            _pending(steps[index])
    for index, step_view in views.items():
        step = steps.get(index)
        if step is None:  # a step event before the plan: a stub step the plan fills in
            step = steps[index] = StepRecord(task_id=event.task_id, index=index)
            session.add(step)
        step.state, step.command_id = step_view.state, step_view.command_id
        step.attempts, step.outputs = step_view.attempts, step_view.outputs
        step.started_at, step.ended_at = step_view.started_at, step_view.ended_at
        step.reason = step_view.reason
    return True


def _pending(step: StepRecord) -> None:
    step.state, step.command_id, step.attempts, step.outputs = "pending", None, 0, {}
    step.started_at = step.ended_at = None
    step.reason = ""


def _fill_plan(session: AsyncSession, task: Task, plan: OpsTask,
               steps: dict[int, StepRecord]) -> None:
    task.parent_task_id = plan.parent_task_id or task.parent_task_id
    task.cluster_id = plan.cluster_id
    task.pool, task.target = plan.pool, plan.target
    task.need_id, task.need_kind, task.kind = plan.need_id, plan.need_kind, plan.kind
    task.template, task.priority, task.dry_run = plan.template, plan.priority, plan.dry_run
    task.evidence = [e.model_dump(mode="json") for e in plan.evidence]
    task.plan = plan.model_dump(mode="json")
    task.step_count = len(plan.steps)
    for planned in planned_steps(plan):
        step = steps.get(planned.index)
        if step is None:
            step = steps[planned.index] = StepRecord(
                task_id=task.task_id, index=planned.index, state="pending", attempts=0,
                outputs={}, reason="")
            session.add(step)
        step.name, step.action, step.action_args = planned.name, planned.action, \
            planned.action_args
        step.guard, step.node_id = planned.guard, planned.node_id
        step.timeout_s, step.max_attempts = planned.timeout_s, planned.max_attempts


class Recorder:
    """The store service's handler of `ops.task-events.v1`."""

    def __init__(self, store: Store, metrics: TaskMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics or TaskMetrics()

    async def record(self, event: TaskEvent) -> bool:
        """Apply one event in its own transaction; False if it was a replay."""
        async with self.store.session() as session:
            recorded = await record_event(session, event)
            # The task's row is in the session already (record_event locked it): no query.
            task = await session.get(Task, event.task_id) if recorded else None
        if task is not None:  # counted once committed
            self.metrics.recorded(event, task.template)
        return recorded

    async def on_task_event(self, event: TaskEvent) -> None:
        if await fail_closed(self.record(event)):
            log.debug("task %s: %s %s/%s by %s", event.task_id, event.state,
                      event.step_index, event.step_state, event.actor)


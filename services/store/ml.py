"""ML task records: the recorder of the router's and the API's ML events, and their queries.

Every event (submission, decision, outcome) becomes a row of `ml_events`, unique by event
id: a replayed one changes nothing. An event for a task the store does not know yet makes a
stub task; the task's row and its attempts' rows are then derived again from its whole log
(services/store/ml_projection.py) under a lock on the task's row.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from uuid import UUID

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected
from services.store.db import Store, fail_closed
from services.store.ml_projection import MlEventModel, MlFact, project
from services.store.models import MlAttempt, MlEvent, MlTask
from services.store.views import MlAttemptRow, MlTaskDetail, MlTaskRow

log = logging.getLogger("clusterwarden.store.ml")
MAX_PAGE: Final = 500
_PARSERS: dict[str, type[MlEventModel]] = {
    "ml_task_submitted": MlTaskSubmitted,
    "model_selected": ModelSelected,
    "ml_task_outcome": MlTaskOutcome,
}


def _insert(session: AsyncSession,
            table: type[MlTask] | type[MlEvent]) -> postgresql.Insert | sqlite.Insert:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the task store supports SQLite and PostgreSQL, not {dialect}")


async def record_ml_event(session: AsyncSession, event: MlEventModel) -> bool:
    """Apply `event` in `session`'s transaction; False if it was recorded before."""
    await session.execute(_insert(session, MlTask).values(
        task_id=event.task_id, cluster_id=event.cluster_id, state="submitted", critical=False,
        attempts=0, reason="", created_at=event.occurred_at, updated_at=event.occurred_at,
    ).on_conflict_do_nothing(index_elements=["task_id"]))
    task = (await session.execute(
        select(MlTask).where(MlTask.task_id == event.task_id).with_for_update()
    )).scalar_one()
    inserted = await session.execute(_insert(session, MlEvent).values(
        event_id=event.event_id, task_id=event.task_id, event_type=event.event_type,
        occurred_at=event.occurred_at, body=event.model_dump(mode="json"),
    ).on_conflict_do_nothing(index_elements=["event_id"]).returning(MlEvent.id))
    if inserted.scalar_one_or_none() is None:
        return False

    rows = (await session.execute(
        select(MlEvent).where(MlEvent.task_id == event.task_id))).scalars().all()
    # Through JSON: the events are strict, and a UUID or a time is text in the stored body.
    facts = [MlFact(row.id, _PARSERS[row.event_type].model_validate_json(json.dumps(row.body)))
             for row in rows]
    view, attempts = project(facts)
    for name in ("state", "task_type", "priority", "critical", "submitted_by", "deadline",
                 "input", "attempts", "node_id", "model", "version", "family", "cause",
                 "reason", "prediction", "confidence", "latency_ms", "created_at",
                 "updated_at", "finished_at"):
        setattr(task, name, getattr(view, name))
    existing = {a.attempt: a for a in (await session.execute(
        select(MlAttempt).where(MlAttempt.task_id == event.task_id))).scalars()}
    for number, attempt_view in attempts.items():
        row = existing.get(number)
        if row is None:
            row = MlAttempt(task_id=event.task_id, attempt=number)
            session.add(row)
        for name, value in vars(attempt_view).items():
            setattr(row, name, value)
    return True


class MlRecorder:
    """The store service's handler of the three ML topics."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def record(self, event: MlEventModel) -> bool:
        async with self.store.session() as session:
            return await record_ml_event(session, event)

    async def on_event(self, event: MlEventModel) -> None:
        if await fail_closed(self.record(event)):
            log.debug("ml task %s: %s", event.task_id, event.event_type)

    async def on_submitted(self, event: MlTaskSubmitted) -> None:
        await self.on_event(event)

    async def on_selected(self, event: ModelSelected) -> None:
        await self.on_event(event)

    async def on_outcome(self, event: MlTaskOutcome) -> None:
        await self.on_event(event)


# ------------------------------------------------------------------ queries


@dataclass(frozen=True)
class MlTaskFilter:
    """Which ML tasks to list; None matches everything. `node`/`model`: the latest attempt's
    or any attempt's. `since`/`until` as for ops tasks (naive times are UTC)."""

    cluster: str | None = None
    state: str | None = None
    task_type: str | None = None
    node: str | None = None
    model: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _conditions(f: MlTaskFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if f.cluster is not None:
        conditions.append(MlTask.cluster_id == f.cluster)
    if f.state is not None:
        conditions.append(MlTask.state == f.state)
    if f.task_type is not None:
        conditions.append(MlTask.task_type == f.task_type)
    if f.node is not None:
        on_node = select(MlAttempt.task_id).where(MlAttempt.node_id == f.node)
        conditions.append(or_(MlTask.node_id == f.node, MlTask.task_id.in_(on_node)))
    if f.model is not None:
        with_model = select(MlAttempt.task_id).where(MlAttempt.model == f.model)
        conditions.append(or_(MlTask.model == f.model, MlTask.task_id.in_(with_model)))
    if f.since is not None:
        conditions.append(MlTask.updated_at >= _utc(f.since))
    if f.until is not None:
        conditions.append(MlTask.created_at < _utc(f.until))
    return conditions


async def list_ml_tasks(session: AsyncSession, f: MlTaskFilter, limit: int = 50,
                        offset: int = 0) -> tuple[list[MlTaskRow], int]:
    """One page of the matching ML tasks, newest first, and how many match in all."""
    limit, offset = max(1, min(limit, MAX_PAGE)), max(0, offset)
    conditions = _conditions(f)
    total = (await session.execute(
        select(func.count()).select_from(MlTask).where(*conditions))).scalar_one()
    rows = (await session.execute(
        select(MlTask).where(*conditions)
        .order_by(MlTask.created_at.desc(), MlTask.task_id).limit(limit).offset(offset)
    )).scalars().all()
    return [MlTaskRow.model_validate(row) for row in rows], int(total)


async def get_ml_task(session: AsyncSession, task_id: UUID) -> MlTaskDetail | None:
    """An ML task with its input and every attempt (its decision's candidates included)."""
    task = (await session.execute(
        select(MlTask).where(MlTask.task_id == task_id))).scalar_one_or_none()
    if task is None:
        return None
    attempts = (await session.execute(
        select(MlAttempt).where(MlAttempt.task_id == task_id).order_by(MlAttempt.attempt)
    )).scalars().all()
    return MlTaskDetail.model_validate({
        **MlTaskRow.model_validate(task).model_dump(),
        "input": task.input,
        "attempt_list": [MlAttemptRow.model_validate(a) for a in attempts],
    })

"""The alerts' rows in the task store: apply an event, acknowledge, list, and find what is
due for delivery. Each call runs in its caller's transaction, the alert's row locked."""

from __future__ import annotations

from dataclasses import asdict, fields
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events.v1 import Alert
from services.alerts.policy import AlertState, Transition, acknowledge, apply
from services.store.models import AlertRecord
from services.store.views import AlertRow

MAX_PAGE: Final = 500
_STATE_FIELDS: Final = tuple(f.name for f in fields(AlertState))


def state_of(row: AlertRecord) -> AlertState:
    return AlertState(**{name: getattr(row, name) for name in _STATE_FIELDS})


def _write(row: AlertRecord, state: AlertState) -> None:
    for name, value in asdict(state).items():
        setattr(row, name, value)


async def _locked(session: AsyncSession, cluster: str, key: str) -> AlertRecord | None:
    return (await session.execute(
        select(AlertRecord).where(AlertRecord.cluster_id == cluster,
                                  AlertRecord.dedup_key == key).with_for_update()
    )).scalar_one_or_none()


async def record_alert(session: AsyncSession, alert: Alert) -> Transition | None:
    """Apply `alert` to its alert's row; the change, or None if nothing changed.

    Two instances inserting the same new alert at once: one insert fails on the primary key
    when the transaction commits, and that event is delivered again, then finds the row.
    """
    row = await _locked(session, alert.cluster_id, alert.dedup_key)
    transition = apply(None if row is None else state_of(row), alert)
    if transition is None:
        return None
    if row is None:
        row = AlertRecord(cluster_id=alert.cluster_id, dedup_key=alert.dedup_key)
        session.add(row)
    _write(row, transition.state)
    row.last_change = transition.change
    # Alertmanager and the webhooks have not heard of this change yet.
    row.delivered_at = None
    row.webhook_pending = True
    return transition


async def acknowledge_alert(session: AsyncSession, cluster: str, key: str, actor: str,
                            reason: str, now: datetime) -> AlertRow | None:
    """Mark the alert seen by `actor`; the alert after, or None if there is no such alert."""
    row = await _locked(session, cluster, key)
    if row is None:
        return None
    _write(row, acknowledge(state_of(row), actor, reason, now))
    row.last_change = "acknowledged"
    row.delivered_at = None
    row.webhook_pending = True
    await session.flush()
    return AlertRow.model_validate(row)


async def list_alerts(session: AsyncSession, status: str | None, cluster: str | None,
                      limit: int, offset: int) -> tuple[list[AlertRow], int]:
    """Alerts, firing first, then the most recently changed."""
    query = select(AlertRecord)
    if status is not None:
        query = query.where(AlertRecord.status == status)
    if cluster is not None:
        query = query.where(AlertRecord.cluster_id == cluster)
    total = (await session.execute(
        select(func.count()).select_from(query.subquery()))).scalar_one()
    rows = (await session.execute(
        query.order_by(AlertRecord.status, AlertRecord.updated_at.desc())
        .limit(limit).offset(offset))).scalars().all()
    return [AlertRow.model_validate(row) for row in rows], total


async def due_for_delivery(session: AsyncSession, now: datetime, resend_s: float,
                           limit: int = MAX_PAGE) -> list[AlertRecord]:
    """Rows Alertmanager must hear of: every change not delivered yet, and each firing alert
    whose last delivery is a resend interval old (its endsAt must move on)."""
    stale = now - timedelta(seconds=resend_s)
    return list((await session.execute(
        select(AlertRecord).where(or_(
            AlertRecord.delivered_at.is_(None),
            AlertRecord.webhook_pending.is_(True),
            (AlertRecord.status == "firing") & (AlertRecord.delivered_at < stale),
        )).order_by(AlertRecord.updated_at).limit(limit).with_for_update(skip_locked=True)
    )).scalars().all())

"""Alerts: the state of each one (firing first), and acknowledging one (operator; audited).

An acknowledgement is written to the alert's row; the alerts service tells Alertmanager and
the webhooks on its next delivery round (the alert keeps firing until its cause ends).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel

from schemas.envelope import Identifier
from schemas.events.v1 import now_utc
from services.alerts.records import MAX_PAGE, acknowledge_alert, list_alerts
from services.api.bodies import ReasonBody
from services.api.deps import Operator, RuntimeDep, Viewer, audit
from services.store.db import fail_closed
from services.store.views import AlertRow

router = APIRouter(prefix="/alerts", tags=["alerts"])


class AlertPage(BaseModel):
    items: list[AlertRow]
    total: int
    limit: int
    offset: int


@router.get("", response_model=AlertPage, summary="Alerts, firing first")
async def alerts(
    rt: RuntimeDep, _: Viewer,
    state: Annotated[Literal["firing", "resolved"] | None, Query(alias="status")] = None,
    cluster: Annotated[Identifier | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> AlertPage:
    async with rt.store.session() as session:
        rows, total = await fail_closed(list_alerts(session, state, cluster, limit, offset))
    return AlertPage(items=rows, total=total, limit=limit, offset=offset)


@router.post("/{cluster}/{dedup_key}/ack", response_model=AlertRow,
             summary="Acknowledge an alert (operator; audited)")
async def acknowledge(cluster: Identifier, dedup_key: Identifier, body: ReasonBody,
                      rt: RuntimeDep, who: Operator) -> AlertRow:
    target = f"alert/{cluster}/{dedup_key}"
    async with rt.store.session() as session:
        acknowledged = await fail_closed(acknowledge_alert(
            session, cluster, dedup_key, who.user, body.reason, now_utc()))
    if acknowledged is None:
        await audit(rt, who, "alert_ack", target, body.reason, "404 no such alert", {})
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no alert {dedup_key} on {cluster}")
    await audit(rt, who, "alert_ack", target, body.reason, "acknowledged", {})
    return acknowledged

"""Nodes, clusters (pools, open needs, budgets, breakers), breaker resets and capacity."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, Field

from schemas.envelope import Identifier, reason_text
from schemas.events.v1 import BreakerScope, now_utc
from schemas.ranges import BandArgs
from schemas.topics import Topic
from services.api import forecasting
from services.api.bodies import ReasonBody
from services.api.cluster import (
    BreakerOut,
    ClusterOut,
    HistoryPoint,
    NodeOut,
    Resolution,
    breaker_out,
)
from services.api.deps import Admin, RuntimeDep, Viewer, audit, client_detail
from services.api.publisher import PublishFailed
from services.scheduler.breaker import breaker_named
from services.scheduler.breaker_store import BreakerUnreadable
from services.scheduler.handlers import reset_alert
from services.shared.audit import AuditLog
from services.store.queries import append_audit

router = APIRouter(tags=["cluster"])
SOURCE = "api"
# A day of minutes: the collector keeps no more per node.
MAX_NODE_HISTORY = 1_440
MAX_POINTS = 10_080


class NodesOut(BaseModel):
    nodes: list[NodeOut]


class ClustersOut(BaseModel):
    clusters: list[ClusterOut]


@router.get("/nodes", response_model=NodesOut,
            summary="Node states, utilisation, mode and jobs")
async def nodes(
    rt: RuntimeDep, _: Viewer,
    cluster: Annotated[Identifier | None, Query(description="Every cluster if omitted.")] = None,
    history_minutes: Annotated[int, Query(
        ge=0, le=MAX_NODE_HISTORY, description="Per-minute utilisation to include.")] = 0,
) -> NodesOut:
    names = [cluster] if cluster else await rt.reader.clusters(rt.settings.cluster_id)
    found: list[NodeOut] = []
    for name in names:
        found += await rt.reader.nodes(name, history_minutes)
    return NodesOut(nodes=found)


@router.get("/clusters", response_model=ClustersOut,
            summary="Pools with utilisation, nodes by state, open needs, budgets, breakers")
async def clusters(rt: RuntimeDep, _: Viewer) -> ClustersOut:
    now = now_utc()
    return ClustersOut(clusters=[await rt.reader.cluster(name, now) for name in
                                 await rt.reader.clusters(rt.settings.cluster_id)])


@router.get("/breakers", response_model=list[BreakerOut], summary="Every circuit breaker")
async def breakers(rt: RuntimeDep, _: Viewer,
                   cluster: Identifier | None = None) -> list[BreakerOut]:
    return await rt.reader.breaker_list(cluster)


class BreakerResetRequest(ReasonBody):
    cluster: Identifier
    kind: Annotated[str, Field(
        pattern=r"^[A-Za-z0-9_.-]{1,128}(@([A-Za-z0-9_.-]{1,128}|\*))?$",
        description="The task kind (offline, migrate, ...), or kind@node / kind@* as listed.")]
    node: Identifier | None = Field(default=None, description="For node-scoped breakers.")
    scope: BreakerScope | None = Field(
        default=None, description="kind, node or cluster; None: told by `kind` and `node`.")


class BreakerResetOut(BaseModel):
    before: BreakerOut
    after: BreakerOut
    audit_seq: int = Field(description="Its entry in the scheduler's audit stream (Redis).")
    alert_published: bool


@router.post("/breakers/reset", response_model=BreakerResetOut,
             summary="Close a breaker (admin; audited, announced with an info alert)")
async def breaker_reset(body: BreakerResetRequest, request: Request, rt: RuntimeDep,
                        who: Admin) -> BreakerResetOut:
    try:
        name = breaker_named(body.kind, body.node, body.scope)
    except ValueError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from err
    target = f"breaker/{body.cluster}/{name}"
    detail = client_detail(request)
    store = rt.reader.breakers
    # Resetting a misspelt breaker would report success and leave the real one open.
    if not await rt.redis.exists(store.key(body.cluster, name)):
        await audit(rt, who, "breaker_reset", target, body.reason, "404 no such breaker",
                    detail)
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"no breaker {body.cluster}/{name} (GET /api/v1/breakers lists them)")
    try:
        # The reset and its entry in the scheduler's own audit stream are one atomic write.
        reset = await store.reset(body.cluster, name, who.user, body.reason,
                                  AuditLog(rt.redis, rt.keys), role=who.role)
    except BreakerUnreadable as err:
        await audit(rt, who, "breaker_reset", target, body.reason, "503 breaker busy", detail)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(err)) from err
    await audit(rt, who, "breaker_reset", target, body.reason,
                f"{reset.before.status} -> {reset.after.status}",
                detail | {"redis_audit_seq": reset.record.entry.seq,
                          "redis_audit_hash": reset.record.hash})
    published = True
    try:
        await rt.publisher.publish(Topic.OPS_ALERTS,
                                   reset_alert(body.cluster, name, reset, SOURCE))
    except PublishFailed:
        # The reset and its audit entries stand; only the announcement is missing.
        published = False
    return BreakerResetOut(
        before=breaker_out(body.cluster, name, reset.before),
        after=breaker_out(body.cluster, name, reset.after),
        audit_seq=reset.record.entry.seq, alert_published=published,
    )


class Band(BaseModel):
    """The pool's utilisation range (the scale need's): enter and exit on each side."""

    low_enter: float
    low_exit: float
    high_enter: float
    high_exit: float


class CapacityOut(BaseModel):
    cluster: str
    pool: str
    resolution_s: int
    history: list[HistoryPoint] = Field(description="Effective utilisation, oldest first.")
    band: Band
    forecast: dict[str, Any] | None = Field(
        description="Hourly forecast for the next day and week (services.forecast Forecast); "
                    "None when there is none (see forecast_error).")
    capacity_report: dict[str, Any] | None = Field(
        description="The forecast read against the band: when the range is left, nodes "
                    "needed, a shadow scale-out (services.forecast CapacityReport).")
    forecast_error: str | None = None
    generated_at: datetime


@router.get("/capacity", response_model=CapacityOut,
            summary="A pool's utilisation history, its range band, forecast and capacity report")
async def capacity(
    rt: RuntimeDep, _: Viewer,
    cluster: Identifier | None = None,
    pool: Identifier = "default",
    resolution: Annotated[Resolution, Query(
        description="Seconds per point: 10 (a day kept), 60 (a week), 3600 (a year).")
    ] = Resolution.MINUTE,
    points: Annotated[int, Query(ge=1, le=MAX_POINTS)] = 1_440,
) -> CapacityOut:
    cluster = cluster or rt.settings.cluster_id
    now = now_utc()
    history = await rt.reader.pool_history(cluster, pool, resolution, points)
    args = rt.analyzer.args_for("scale", cluster, pool)
    band = BandArgs.model_validate(args.model_dump())
    outlook = await forecasting.outlook(rt.reader, rt.redis, rt.keys, rt.forecasts, cluster,
                                        pool, band, now)
    proposal = (outlook.capacity or {}).get("proposal")
    if outlook.fresh and isinstance(proposal, dict):
        # Shadow mode: the proposal is recorded (in the audit log, with what it saw) and
        # never acted on; a forecast never proposes a scale-in.
        async with rt.store.session() as session:
            await append_audit(
                session, actor="forecast", role="system", action="shadow_scale_out",
                target=f"{cluster}/{pool}", reason=reason_text(str(proposal.get("reason", ""))),
                result="recorded, not acted on", detail={"proposal": proposal},
            )
    return CapacityOut(
        cluster=cluster, pool=pool, resolution_s=int(resolution), history=history,
        band=Band.model_validate(band.model_dump(include=set(Band.model_fields))),
        forecast=outlook.forecast, capacity_report=outlook.capacity,
        forecast_error=outlook.error, generated_at=now)

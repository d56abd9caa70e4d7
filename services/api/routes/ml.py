"""ML tasks: submit one (operator), list and show them from the store, see the models.

A submission is published on `ml.tasks.submitted.v1` and answered 202 with the task's id:
the router chooses the model, the store records what happens (GET shows it once the store
has the submission, usually within a second). `/api/v1/ml/models` reads the live registry and
the selector's statistics from Redis: which model versions each node serves, whether they
are ready, and how each arm is doing.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Annotated
from uuid import UUID, uuid4

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, ConfigDict, Field

from schemas.envelope import Identifier
from schemas.events.v1 import MlInput, MlTaskState, MlTaskSubmitted, Priority, now_utc
from schemas.topics import Topic
from services.api.deps import Operator, RuntimeDep, Viewer
from services.api.publisher import PublishFailed
from services.router.policy.selector import snapshot_keys
from services.router.policy.stats import estimate
from services.router.registry import NodeModels, candidates, split_model
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.store.ml import MlTaskFilter, get_ml_task, list_ml_tasks
from services.store.views import MlTaskDetail, MlTaskRow

router = APIRouter(prefix="/ml", tags=["ml"])
SOURCE = "api"
MAX_PAGE = 500


class MlTaskRequest(BaseModel):
    """An ML task: what to run it on is the router's choice."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    task_type: Identifier = Field(description="e.g. digits")
    input: MlInput = Field(description="The numbers the model takes (digits: 64 pixel "
                           "counts 0..16).")
    deadline_s: float = Field(default=10.0, gt=0.0, le=3_600.0,
                              description="Seconds from now the task must be done in.")
    priority: Priority = 5
    critical: bool = Field(default=False, description="Choose by a pessimistic bound of "
                           "each model's success rate, not a sample.")


class MlTaskAccepted(BaseModel):
    """The submission was published; the router takes it from there."""

    accepted: bool = True
    task_id: UUID
    event_id: UUID
    deadline: datetime


class MlTaskPage(BaseModel):
    items: list[MlTaskRow]
    total: int = Field(description="Tasks matching the filter, over every page.")
    limit: int
    offset: int


class ArmView(BaseModel):
    """One model version on one node, as the router sees it now."""

    node_id: str
    task_type: str
    model: str
    version: str
    family: str
    model_state: str = Field(description="loading, ready or failed, as the node reported.")
    node_mode: str
    reported_at: datetime
    ready: bool = Field(description="The router may send it tasks (ready, active, fresh).")
    accuracy: float | None
    quarantine: str = Field(description="closed, open (until quarantined_until) or half_open.")
    quarantined_until: datetime | None
    n_eff: float = Field(description="Decayed outcomes counted against or for the arm.")
    mean: float = Field(description="Posterior mean success rate (with its parents' prior).")
    lower: float
    upper: float
    inflight: int
    latency_ms: float | None


class ModelsView(BaseModel):
    cluster_id: str
    arms: list[ArmView]


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@router.post("/tasks", status_code=202, response_model=MlTaskAccepted,
             responses={503: {"description": "Kafka unreachable"}},
             summary="Submit an ML task (operator)")
async def ml_submit(body: MlTaskRequest, rt: RuntimeDep, who: Operator) -> MlTaskAccepted:
    now = now_utc()
    task_id = uuid4()
    event = MlTaskSubmitted(
        event_id=uuid4(), source=SOURCE, occurred_at=now, cluster_id=rt.settings.cluster_id,
        subject=str(task_id), task_id=task_id, task_type=body.task_type, input=body.input,
        deadline=now + timedelta(seconds=body.deadline_s), priority=body.priority,
        critical=body.critical, submitted_by=who.user)
    try:
        await rt.publisher.publish(Topic.ML_TASKS_SUBMITTED, event)
    except PublishFailed as err:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "the task could not be published (Kafka); try again") from err
    return MlTaskAccepted(task_id=task_id, event_id=event.event_id, deadline=event.deadline)


@router.get("/tasks", response_model=MlTaskPage, summary="List ML tasks, newest first")
async def ml_list(
    rt: RuntimeDep, _: Viewer,
    cluster: Identifier | None = None,
    state: MlTaskState | None = None,
    task_type: Identifier | None = None,
    node: Annotated[Identifier | None, Query(description="Any attempt ran there.")] = None,
    model: Annotated[Identifier | None, Query(description="Any attempt used it.")] = None,
    since: Annotated[datetime | None, Query(description="Active at or after (ISO).")] = None,
    until: Annotated[datetime | None, Query(description="Created before (ISO).")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> MlTaskPage:
    task_filter = MlTaskFilter(cluster=cluster, state=state, task_type=task_type, node=node,
                               model=model, since=_utc(since), until=_utc(until))
    async with rt.store.session() as session:
        rows, total = await list_ml_tasks(session, task_filter, limit=limit, offset=offset)
    return MlTaskPage(items=rows, total=total, limit=limit, offset=offset)


@router.get("/tasks/{task_id}", response_model=MlTaskDetail,
            summary="An ML task with its input and attempts (each decision's candidates)")
async def ml_show(task_id: UUID, rt: RuntimeDep, _: Viewer) -> MlTaskDetail:
    async with rt.store.session() as session:
        found = await get_ml_task(session, task_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no ML task {task_id}")
    return found


@router.get("/models", response_model=ModelsView,
            summary="The model registry and each arm's statistics, live")
async def ml_models(rt: RuntimeDep, _: Viewer, cluster: Identifier | None = None,
                    task_type: Identifier | None = None) -> ModelsView:
    cluster_id = cluster or rt.settings.cluster_id
    router_settings = RouterSettings()
    now = time.time()
    raw = await rt.redis.hgetall(rt.keys.ml_registry(cluster_id))
    entries = sorted((NodeModels.model_validate_json(body) for body in raw.values()),
                     key=lambda e: e.node)
    by_node = {e.node: e for e in entries}
    types = sorted({m.task_type for e in entries for m in e.models
                    if task_type is None or m.task_type == task_type})
    stats = StatsStore(rt.keys, router_settings.stats_ttl_s)
    arms: list[ArmView] = []
    for kind in types:
        found = candidates(entries, kind, now, router_settings.fallbacks,
                           router_settings.registry_stale_after_s)
        snapshot = await stats.read(rt.redis, cluster_id, snapshot_keys(found))
        for c in found:
            name, version = split_model(c.model)
            entry = by_node[c.node]
            served = next(m for m in entry.models
                          if m.task_type == kind and (m.model, m.version) == (name, version))
            est = estimate(snapshot, c.model, c.node, c.family, now, router_settings.policy,
                           c.predecessor)
            arm = snapshot.arm(c.model, c.node)
            q = arm.q_state(now)
            arms.append(ArmView(
                node_id=c.node, task_type=kind, model=name, version=version, family=c.family,
                model_state=served.state, node_mode=entry.mode,
                reported_at=datetime.fromtimestamp(entry.at, UTC), ready=c.ready,
                accuracy=served.accuracy, quarantine=q,
                quarantined_until=(datetime.fromtimestamp(arm.q_until, UTC)
                                   if q != "closed" else None),
                n_eff=round(est.n_eff, 3), mean=round(est.mean, 4), lower=round(est.lower, 4),
                upper=round(est.upper, 4), inflight=arm.live_inflight(now, router_settings.policy),
                latency_ms=round(arm.latency_s * 1000.0, 3) if arm.latency_s > 0 else None))
    return ModelsView(cluster_id=cluster_id, arms=arms)

"""Tasks: list and show from the store; pause, resume, retry, terminate, jump and restart as
controls."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID, uuid4

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, Field

from schemas.envelope import Identifier
from schemas.events.v1 import StepIndex, TaskControl, TaskState, now_utc
from schemas.topics import Topic
from services.api.auth import Principal
from services.api.bodies import ReasonBody
from services.api.control import decide
from services.api.deps import Admin, Operator, Runtime, RuntimeDep, Viewer, audit, client_detail
from services.api.publisher import PublishFailed
from services.executor.control import ControlAction
from services.shared.vouchers import ControlVouchers
from services.store.queries import TaskFilter, get_task, list_tasks
from services.store.views import TaskDetail, TaskRow

router = APIRouter(prefix="/tasks", tags=["tasks"])
SOURCE = "api"
MAX_PAGE = 500


class TaskPage(BaseModel):
    items: list[TaskRow]
    total: int = Field(description="Tasks matching the filter, over every page.")
    limit: int
    offset: int


class ControlRequest(ReasonBody):
    """Every intervention says why (kept with the control event and in the audit log)."""


class JumpRequest(ReasonBody):
    step_index: StepIndex


class ControlAccepted(BaseModel):
    """The control event was published; the executor applies it (or refuses it, recorded
    as a `refused ...` transition) when it arrives."""

    accepted: bool = True
    control_event_id: UUID
    task_id: UUID
    action: ControlAction
    expected_state: TaskState = Field(description="The state the control should lead to.")
    note: str


def _utc(moment: datetime | None) -> datetime | None:
    """A naive time given in a query is taken as UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@router.get("", response_model=TaskPage, summary="List tasks, filtered, newest first")
async def tasks_list(
    rt: RuntimeDep, _: Viewer,
    node: Annotated[Identifier | None, Query(description="Target or a step's node.")] = None,
    cluster: Identifier | None = None,
    state: TaskState | None = None,
    kind: Annotated[Identifier | None, Query(description="Need kind or task kind.")] = None,
    since: Annotated[datetime | None, Query(description="Created at or after (ISO).")] = None,
    until: Annotated[datetime | None, Query(description="Created before (ISO).")] = None,
    parent: Annotated[UUID | None, Query(description="Children of this task.")] = None,
    top_level: Annotated[bool, Query(description="Only tasks without a parent.")] = False,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> TaskPage:
    task_filter = TaskFilter(node=node, cluster=cluster, state=state, kind=kind,
                             since=_utc(since), until=_utc(until), parent=parent,
                             top_level_only=top_level)
    async with rt.store.session() as session:
        rows, total = await list_tasks(session, task_filter, limit=limit, offset=offset)
    return TaskPage(items=rows, total=total, limit=limit, offset=offset)


@router.get("/{task_id}", response_model=TaskDetail,
            summary="A task with its steps, transitions, children and evidence")
async def tasks_show(task_id: UUID, rt: RuntimeDep, _: Viewer) -> TaskDetail:
    async with rt.store.session() as session:
        detail = await get_task(session, task_id)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no task {task_id}")
    return detail


async def control(rt: Runtime, principal: Principal, request: Request, task_id: UUID,
                  action: ControlAction, reason: str,
                  step_index: int | None = None) -> ControlAccepted:
    """Check the control against the recorded task, audit it, then publish it."""
    target = f"task/{task_id}"
    detail = client_detail(request)
    if step_index is not None:
        detail["step_index"] = step_index
    async with rt.store.session() as session:
        task = await get_task(session, task_id)
    if task is None:
        await audit(rt, principal, action, target, reason, "404 no such task", detail)
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no task {task_id}")
    n_steps = task.step_count if task.step_count is not None else len(task.steps)
    decision = decide(task.state, n_steps, task.transitions, action, step_index)
    if not decision.allowed:
        await audit(rt, principal, action, target, reason,
                    f"409 refused: {decision.reason}", detail | {"state": task.state})
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"cannot {action} a task that is {task.state}: {decision.reason}")
    event = TaskControl(
        event_id=uuid4(), source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
        subject=str(task_id), task_id=task_id, action=action, step_index=step_index,
        actor=principal.user, reason=reason,
    )
    detail |= {"control_event_id": str(event.event_id), "state": task.state}
    # Audited before it is published: no control leaves without its entry; vouched for, so
    # the executor applies it (and no control published by anyone else).
    await audit(rt, principal, action, target, reason, "accepted", detail)
    await ControlVouchers(rt.redis, rt.keys).vouch(event)
    try:
        await rt.publisher.publish(Topic.OPS_TASK_CONTROL, event)
    except PublishFailed as err:
        await audit(rt, principal, action, target, reason, "503 not published", detail)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "the control could not be published (Kafka); nothing was "
                            "changed, try again") from err
    return ControlAccepted(control_event_id=event.event_id, task_id=task_id, action=action,
                           expected_state=decision.new_state, note=decision.reason)


_ACCEPTED: dict[int | str, dict[str, Any]] = {
    status.HTTP_409_CONFLICT: {"description": "Illegal for the task's state"},
    status.HTTP_404_NOT_FOUND: {"description": "No such task"},
    status.HTTP_503_SERVICE_UNAVAILABLE: {"description": "Kafka unreachable"},
}


@router.post("/{task_id}/pause", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED, summary="Pause at the next step boundary (operator)")
async def tasks_pause(task_id: UUID, body: ControlRequest, request: Request, rt: RuntimeDep,
                      who: Operator) -> ControlAccepted:
    return await control(rt, who, request, task_id, "pause", body.reason)


@router.post("/{task_id}/resume", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED, summary="Resume a paused task (operator)")
async def tasks_resume(task_id: UUID, body: ControlRequest, request: Request, rt: RuntimeDep,
                       who: Operator) -> ControlAccepted:
    return await control(rt, who, request, task_id, "resume", body.reason)


@router.post("/{task_id}/retry", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED, summary="Retry a failed task from its failed step (operator)")
async def tasks_retry(task_id: UUID, body: ControlRequest, request: Request, rt: RuntimeDep,
                      who: Operator) -> ControlAccepted:
    return await control(rt, who, request, task_id, "retry", body.reason)


@router.post("/{task_id}/terminate", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED, summary="Terminate a task (operator)")
async def tasks_terminate(task_id: UUID, body: ControlRequest, request: Request,
                          rt: RuntimeDep, who: Operator) -> ControlAccepted:
    return await control(rt, who, request, task_id, "terminate", body.reason)


@router.post("/{task_id}/jump", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED,
             summary="Move a paused or failed task to a step, paused there (admin)")
async def tasks_jump(task_id: UUID, body: JumpRequest, request: Request, rt: RuntimeDep,
                     who: Admin) -> ControlAccepted:
    return await control(rt, who, request, task_id, "jump", body.reason, body.step_index)


@router.post("/{task_id}/restart", status_code=202, response_model=ControlAccepted,
             responses=_ACCEPTED,
             summary="Run a failed or terminated task again from its first step (operator)")
async def tasks_restart(task_id: UUID, body: ControlRequest, request: Request,
                        rt: RuntimeDep, who: Operator) -> ControlAccepted:
    return await control(rt, who, request, task_id, "restart", body.reason)

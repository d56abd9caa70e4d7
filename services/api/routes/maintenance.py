"""Intervention on a cluster or a node: maintenance windows (all automation paused) and the
rotation of a node (a planned offline for hardware work, then online again), all audited."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel

from schemas.envelope import Identifier
from schemas.events.v1 import NeedKind, now_utc
from schemas.topics import Topic
from services.api.auth import Principal
from services.api.bodies import ReasonBody
from services.api.deps import Operator, Runtime, RuntimeDep, Viewer, audit, client_detail
from services.api.publisher import PublishFailed
from services.shared.maintenance import (
    MaintenanceStore,
    Window,
    new_window,
    rotation_need,
)

router = APIRouter(tags=["maintenance"])
SOURCE = "api"


class WindowOut(BaseModel):
    cluster: str
    node: str | None
    kind: str
    actor: str
    reason: str
    started_at: float
    window_id: str


class WindowsOut(BaseModel):
    windows: list[WindowOut]


class MaintenanceRequest(ReasonBody):
    cluster: Identifier
    node: Identifier | None = None


class RotationRequest(ReasonBody):
    cluster: Identifier


class RotationAccepted(BaseModel):
    """The rotation's window and the need published for the templater."""

    window: WindowOut
    need_kind: NeedKind
    need_event_id: str


def out(window: Window) -> WindowOut:
    return WindowOut(cluster=window.cluster, node=window.node, kind=window.kind,
                     actor=window.actor, reason=window.reason, started_at=window.started_at,
                     window_id=window.window_id)


def store(rt: Runtime) -> MaintenanceStore:
    return MaintenanceStore(rt.redis, rt.keys)


def scope(cluster: str, node: str | None) -> str:
    return f"cluster/{cluster}" + (f"/node/{node}" if node else "")


@router.get("/maintenance", response_model=WindowsOut, summary="Maintenance windows")
async def maintenance_list(rt: RuntimeDep, _: Viewer,
                           cluster: Identifier | None = None) -> WindowsOut:
    names = [cluster] if cluster else await rt.reader.clusters(rt.settings.cluster_id)
    found: list[WindowOut] = []
    for name in names:
        found += [out(w) for w in (await store(rt).windows(name)).values()]
    return WindowsOut(windows=found)


@router.post("/maintenance/start", status_code=201, response_model=WindowOut,
             summary="Pause all automation of a cluster or a node (operator)")
async def maintenance_start(body: MaintenanceRequest, request: Request, rt: RuntimeDep,
                            who: Operator) -> WindowOut:
    window = new_window(body.cluster, body.node, who.user, body.reason, now_utc())
    return out(await _start(rt, who, request, window))


@router.post("/maintenance/end", response_model=WindowOut,
             summary="End a maintenance window: automation resumes (operator)")
async def maintenance_end(body: MaintenanceRequest, request: Request, rt: RuntimeDep,
                          who: Operator) -> WindowOut:
    target, detail = scope(body.cluster, body.node), client_detail(request)
    ended = await store(rt).end(body.cluster, body.node)
    if ended is None:
        await audit(rt, who, "maintenance_end", target, body.reason, "404 none", detail)
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no maintenance of {target}")
    await audit(rt, who, "maintenance_end", target, body.reason, "ended",
                detail | {"window_id": ended.window_id, "kind": ended.kind})
    return out(ended)


async def _start(rt: Runtime, who: Principal, request: Request, window: Window) -> Window:
    """Start a window (409 if its scope has one already), audited either way."""
    target, detail = scope(window.cluster, window.node), client_detail(request)
    action = f"{window.kind}_start"
    existing = await store(rt).start(window)
    if existing is not None:
        await audit(rt, who, action, target, window.reason, "409 already", detail)
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"{target} is already under {existing.describe()}")
    await audit(rt, who, action, target, window.reason, "started",
                detail | {"window_id": window.window_id})
    return window


# ---------------------------------------------------------------- rotation of a node


async def _publish_need(rt: Runtime, who: Principal, window: Window, kind: NeedKind,
                        detail: dict[str, Any]) -> str:
    """Publish the rotation's need for the node's pool; 404 for a node not in the cluster."""
    node = next((n for n in await rt.reader.nodes(window.cluster, 0)
                 if n.node_id == window.node), None)
    target = scope(window.cluster, window.node)
    if node is None:
        await audit(rt, who, f"rotation_{kind}", target, window.reason, "404 no such node",
                    detail)
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {target}")
    need = rotation_need(window, kind, node.pool or "default", SOURCE, now_utc())
    try:
        await rt.publisher.publish(Topic.OPS_NEEDS, need)
    except PublishFailed as err:
        await audit(rt, who, f"rotation_{kind}", target, window.reason, "503 not published",
                    detail)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "the need could not be published (Kafka); try again") from err
    return str(need.event_id)


@router.post("/nodes/{node}/rotation/start", status_code=202, response_model=RotationAccepted,
             summary="Take a node offline for hardware work; nothing else automates it "
                     "meanwhile (operator)")
async def rotation_start(node: Identifier, body: RotationRequest, request: Request,
                         rt: RuntimeDep, who: Operator) -> RotationAccepted:
    window = new_window(body.cluster, node, who.user, body.reason, now_utc(), "rotation")
    detail = client_detail(request)
    await _start(rt, who, request, window)
    try:
        need_id = await _publish_need(rt, who, window, "offline", detail)
    except HTTPException:
        await store(rt).end(body.cluster, node)  # nothing was asked: no window either
        raise
    await audit(rt, who, "rotation_offline", scope(body.cluster, node), body.reason,
                "published", detail | {"need_event_id": need_id})
    return RotationAccepted(window=out(window), need_kind="offline", need_event_id=need_id)


@router.post("/nodes/{node}/rotation/end", status_code=202, response_model=RotationAccepted,
             summary="Bring a rotated node online again; its automation resumes (operator)")
async def rotation_end(node: Identifier, body: RotationRequest, request: Request,
                       rt: RuntimeDep, who: Operator) -> RotationAccepted:
    target, detail = scope(body.cluster, node), client_detail(request)
    current = (await store(rt).windows(body.cluster)).get(f"node:{node}")
    if current is None or current.kind != "rotation":
        await audit(rt, who, "rotation_online", target, body.reason, "409 not rotated",
                    detail)
        raise HTTPException(status.HTTP_409_CONFLICT, f"{target} is not in rotation")
    # The need first (the rotation's task passes the window), then the window ends.
    asked = replace(current, actor=who.user, reason=body.reason)
    need_id = await _publish_need(rt, who, asked, "online", detail)
    await store(rt).end(body.cluster, node)
    await audit(rt, who, "rotation_online", target, body.reason, "published",
                detail | {"need_event_id": need_id, "window_id": current.window_id})
    return RotationAccepted(window=out(current), need_kind="online", need_event_id=need_id)

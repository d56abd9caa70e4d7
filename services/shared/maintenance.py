"""Maintenance windows: an operator pauses all automation of a cluster or of one node.

A window is kept in Redis (one HASH per cluster, `Keys.maintenance`: field `*` the whole
cluster's window, `node:<id>` a node's) until the operator ends it. While it lasts the
scheduler dispatches no task of the cluster, or none touching the node (its target or a
step's node): such a task stays queued, with the window in its transitions. Detection,
needs and records go on.

A planned offline and online of a node for hardware work (a rotation) is a node window of
kind `rotation` plus the needs it raises (`rotation_need`): the rotation's own tasks, which
carry its evidence, pass the window; every other automation of the node waits for its end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal
from uuid import uuid4

from pydantic import ValidationError
from redis.asyncio import Redis

from common.errors import INFRASTRUCTURE_ERRORS
from schemas.envelope import short_text
from schemas.events.v1 import Evidence, NeedKind, OpsNeed, OpsTask
from services.shared.redis_client import Keys, text

CLUSTER_FIELD = "*"
# The evidence metric of a rotation's needs (and so of its tasks).
ROTATION_METRIC = "operator_rotation"
NOTICE_TTL_S = 7 * 86_400
WindowKind = Literal["maintenance", "rotation"]

# Removes a window and returns it, in one step (two operators ending it get one answer).
_END = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value then redis.call('HDEL', KEYS[1], ARGV[1]) end
return value
"""


class MaintenanceUnreadable(Exception):
    """The windows could not be read (Redis did not answer, or a window does not decode)."""


_UNREADABLE: tuple[type[BaseException], ...] = (
    *INFRASTRUCTURE_ERRORS, ValueError, KeyError, ValidationError)


@dataclass(frozen=True)
class Window:
    """One maintenance window: who started it, why, when, and what it covers."""

    cluster: str
    node: str | None
    actor: str
    reason: str
    started_at: float
    window_id: str
    kind: WindowKind = "maintenance"

    @property
    def scope(self) -> str:
        return f"node {self.node}" if self.node else f"cluster {self.cluster}"

    def describe(self) -> str:
        return f"{self.kind} of {self.scope} by {self.actor}: {self.reason}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> Window:
        data = json.loads(raw)
        return cls(cluster=str(data["cluster"]), node=data.get("node") or None,
                   actor=str(data["actor"]), reason=str(data["reason"]),
                   started_at=float(data["started_at"]), window_id=str(data["window_id"]),
                   kind="rotation" if data.get("kind") == "rotation" else "maintenance")


def new_window(cluster: str, node: str | None, actor: str, reason: str, at: datetime,
               kind: WindowKind = "maintenance") -> Window:
    return Window(cluster, node, actor, reason, at.timestamp(), str(uuid4()), kind)


def field_of(node: str | None) -> str:
    return f"node:{node}" if node else CLUSTER_FIELD


def task_nodes(task: OpsTask) -> set[str]:
    """The nodes a task touches: its target and every step's node."""
    nodes = {task.target}
    for step in task.steps:
        node = getattr(step.action, "node_id", None)
        if isinstance(node, str):
            nodes.add(node)
    return nodes


def is_rotation_task(task: OpsTask, window: Window) -> bool:
    """Whether `task` is the rotation's own (its need came from the rotation of its node)."""
    return (window.kind == "rotation" and window.node == task.target
            and any(e.metric == ROTATION_METRIC for e in task.evidence))


def holding(windows: dict[str, Window], task: OpsTask) -> Window | None:
    """The window that holds `task` back (the cluster's first), or None."""
    if CLUSTER_FIELD in windows:
        return windows[CLUSTER_FIELD]
    for node in sorted(task_nodes(task)):
        window = windows.get(field_of(node))
        if window is not None and not is_rotation_task(task, window):
            return window
    return None


def rotation_need(window: Window, kind: NeedKind, pool: str, source: str,
                  at: datetime) -> OpsNeed:
    """The offline (start) or online (end) need of a node's rotation, for the templater."""
    assert window.node is not None
    return OpsNeed(
        event_id=uuid4(), source=source, occurred_at=at, cluster_id=window.cluster,
        subject=window.node, correlation_id=window.window_id, kind=kind, level="node",
        pool=pool, target=window.node,
        evidence=[Evidence(metric=ROTATION_METRIC, value=1.0, range_low=0.0, range_high=0.0,
                           observed_at=at,
                           detail=short_text(f"rotation by {window.actor}: {window.reason}"))],
    )


class MaintenanceStore:
    """The windows in Redis, for the API (start, end, list) and the scheduler (holding)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._end = redis.register_script(_END)

    async def start(self, window: Window) -> Window | None:
        """Start `window`; None if started, else the window already covering its scope."""
        key = self.keys.maintenance(window.cluster)
        if await self.redis.hsetnx(key, field_of(window.node), window.to_json()):
            return None
        raw = await self.redis.hget(key, field_of(window.node))
        return Window.from_json(text(raw)) if raw else None

    async def end(self, cluster: str, node: str | None) -> Window | None:
        """End the window of the cluster (or of the node): the window ended, or None."""
        raw = await self._end(keys=[self.keys.maintenance(cluster)], args=[field_of(node)])
        return Window.from_json(text(raw)) if raw else None

    async def windows(self, cluster: str) -> dict[str, Window]:
        """Every window of a cluster, by field (`*` or `node:<id>`)."""
        try:
            raw = await self.redis.hgetall(self.keys.maintenance(cluster))
            return {text(k): Window.from_json(text(v)) for k, v in raw.items()}
        except _UNREADABLE as err:
            raise MaintenanceUnreadable(repr(err)) from err

    async def holding(self, task: OpsTask) -> Window | None:
        return holding(await self.windows(task.cluster_id), task)

    async def noticed(self, window: Window, task_id: str) -> bool:
        """Whether the hold of `task_id` by `window` is in the task's transitions already."""
        try:
            return bool(await self.redis.exists(
                self.keys.maintenance_notice(window.window_id, task_id)))
        except INFRASTRUCTURE_ERRORS as err:
            raise MaintenanceUnreadable(repr(err)) from err

    async def mark_noticed(self, window: Window, task_id: str) -> None:
        await self.redis.set(self.keys.maintenance_notice(window.window_id, task_id), "1",
                             ex=NOTICE_TTL_S)

"""The scheduler's relation gate: a template's concurrency and its relations to other
templates (`services/scheduler/relations.py` decides, `relations_store.py` commits).

A task the gate holds back stays queued; its transitions get a `queued` -> `queued` event
naming the blocker, once per blocker. A task whose dependency failed (and whose rule says
`fail`) is failed here, before it ever runs, with the other task named.
"""

from __future__ import annotations

import logging
from typing import Literal

from common.clock import Clock
from common.messaging import EventBus
from schemas.envelope import short_text
from schemas.events.v1 import OpsTask, TaskEvent
from schemas.topics import Topic
from services.scheduler.events import task_event
from services.scheduler.relations import Decision
from services.scheduler.relations_store import RelationStore, RelationsUnreadable
from services.shared.locks import semaphore_lapse_ms

log = logging.getLogger("clusterwarden.scheduler")

# "unbound": the task carries no relations (a child task); "admitted": it took its place and
# is marked running, undone by `undo` if a later limit holds it back; "failed": ended here.
GateAdmission = Literal["unbound", "admitted", "refused", "failed"]
# Final states: the task leaves the index and its semaphore.
ENDED = frozenset({"succeeded", "failed", "terminated"})


class RelationGate:
    """Admits, holds or fails a task by its relations; keeps the open-task index current."""

    def __init__(self, store: RelationStore, bus: EventBus, clock: Clock,
                 lock_margin_s: float) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.lock_margin_s = lock_margin_s

    async def enter(self, task: OpsTask) -> None:
        """Index a task being queued (before it is queued, so no claim misses its entry)."""
        await self.store.enter(task)

    async def admit(self, task: OpsTask, now_ms: int) -> GateAdmission:
        rel = task.relations
        if rel is None:
            return "unbound"
        try:
            decision = await self.store.admit(
                task, rel, now_ms, semaphore_lapse_ms(task, now_ms, self.lock_margin_s))
        except RelationsUnreadable as err:
            log.warning("task %s held back: open tasks unreadable: %s", task.task_id, err)
            return "refused"  # fail closed, like every other limit
        if decision.verdict == "admit":
            return "admitted"
        if decision.verdict == "fail":
            await self._fail(task, decision)
            return "failed"
        await self._announce(task, decision)
        log.info("task %s held back: %s", task.task_id, decision.reason)
        return "refused"

    async def undo(self, task: OpsTask) -> None:
        """Give back an admission a later limit made moot (the task waits again)."""
        if task.relations is not None:
            await self.store.unadmit(task, task.relations)

    async def finished(self, event: TaskEvent) -> None:
        """A final event: the task is no longer open; its outcome is kept for dependents."""
        if event.state in ENDED:
            await self.store.finish(event.cluster_id, str(event.task_id), event.state)

    async def _announce(self, task: OpsTask, decision: Decision) -> None:
        if decision.blocker == "busy":
            return  # contention, not a reason worth a transition
        task_id = str(task.task_id)
        if not await self.store.first_notice(task_id, decision.blocker):
            return
        try:
            await self.bus.publish(Topic.OPS_TASK_EVENTS, task_event(
                task, "queued", "queued", short_text(f"held: {decision.reason}"),
                self.clock(), f"relation:{decision.blocker}"))
        except BaseException:
            await self.store.forget_notice(task_id, decision.blocker)
            raise

    async def _fail(self, task: OpsTask, decision: Decision) -> None:
        log.warning("task %s failed before it ran: %s", task.task_id, decision.reason)
        await self.bus.publish(Topic.OPS_TASK_EVENTS, task_event(
            task, "failed", "queued", short_text(decision.reason), self.clock(),
            f"relation:{decision.blocker}",
            outputs={**decision.outputs, "need_kind": task.need_kind, "kind": task.kind}))
        # Its own final event reaches `finished` too; ended here already so a dependent of
        # this task sees the failure without waiting for the round trip.
        await self.store.finish(task.cluster_id, str(task.task_id), "failed")

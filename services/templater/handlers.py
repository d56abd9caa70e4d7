"""Templater handler: need in, task (and its `created` event) out."""

from __future__ import annotations

import logging
from uuid import uuid5

from opentelemetry import trace

from common.errors import PermanentError
from common.messaging import EventBus
from common.tracing import need_attributes, task_attributes
from schemas import ids
from schemas.events.v1 import NeedKind, OpsNeed, TaskEvent, now_utc
from schemas.topics import Topic
from services.templater.templates import PlanError, Template, plan

log = logging.getLogger("clusterwarden.templater")
SOURCE = "templater"
_tracer = trace.get_tracer("clusterwarden.templater")


class Templater:
    """Makes one task per need from the template registered for the need's kind."""

    def __init__(self, templates: dict[NeedKind, Template], bus: EventBus, dry_run: bool) -> None:
        self.templates = templates
        self.bus = bus
        self.dry_run = dry_run

    async def on_need(self, need: OpsNeed) -> None:
        # A span of the need's trace that names both the need and the task made of it.
        with _tracer.start_as_current_span("templater.plan",
                                           attributes=need_attributes(need)) as span:
            await self._plan(need, span)

    async def _plan(self, need: OpsNeed, span: trace.Span) -> None:
        template = self.templates.get(need.kind)
        if template is None:
            raise PermanentError("unknown_template", f"no template serves need {need.kind!r}")
        now = now_utc()
        try:
            task = plan(template, need, now, SOURCE, dry_run=self.dry_run)
        except PlanError as err:
            # The same need would fail the same way on every redelivery: dead-letter it.
            raise PermanentError("plan_failed", str(err)) from err
        span.set_attributes(task_attributes(task))
        # `created` first: the task store must know a task before any later transition.
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS,
            TaskEvent(
                event_id=uuid5(ids.TASK_EVENTS, f"{task.task_id}:created"),
                source=SOURCE, occurred_at=now, cluster_id=task.cluster_id,
                subject=str(task.task_id), correlation_id=str(need.event_id),
                task_id=task.task_id, state="created", actor=SOURCE,
                reason=f"need {need.kind} for {need.target} via template {task.template}",
                task=task,
            ),
        )
        await self.bus.publish(Topic.OPS_TASKS, task)
        log.info("task %s (%s) for %s%s", task.task_id, task.template, task.target,
                 " (dry run)" if task.dry_run else "")

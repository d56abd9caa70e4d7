"""Pure: what an ML task's recorded events say about the task and its attempts.

Like the ops tasks' projection, everything is derived from the task's whole log ordered by
when it happened (then by arrival), so the result does not depend on the order the events
of three topics arrived in, and a replayed event changes nothing. The first final outcome
is the task's end: a later one (a submission replayed long after, say) does not undo it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected

MlEventModel = MlTaskSubmitted | ModelSelected | MlTaskOutcome


@dataclass(frozen=True)
class MlFact:
    """One recorded event, parsed."""

    seq: int
    event: MlEventModel

    @property
    def occurred_at(self) -> datetime:
        return self.event.occurred_at


@dataclass
class AttemptView:
    """One attempt's row."""

    attempt: int
    status: str
    node_id: str | None = None
    model: str | None = None
    version: str | None = None
    family: str | None = None
    command_id: UUID | None = None
    probe: bool = False
    decision_reason: str = ""
    candidates: list[dict[str, Any]] = field(default_factory=list)
    decided_at: datetime | None = None
    outcome: str | None = None
    cause: str | None = None
    attributed_to: str | None = None
    latency_ms: float | None = None
    node_latency_ms: float | None = None
    prediction: int | None = None
    confidence: float | None = None
    ended_at: datetime | None = None
    reason: str = ""


@dataclass
class MlTaskView:
    """The task's row."""

    state: str = "submitted"
    task_type: str | None = None
    priority: int | None = None
    critical: bool = False
    submitted_by: str | None = None
    deadline: datetime | None = None
    input: list[float] | None = None
    attempts: int = 0
    node_id: str | None = None
    model: str | None = None
    version: str | None = None
    family: str | None = None
    cause: str | None = None
    reason: str = ""
    prediction: int | None = None
    confidence: float | None = None
    latency_ms: float | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None


def project(facts: Sequence[MlFact]) -> tuple[MlTaskView, dict[int, AttemptView]]:
    """The task and its attempts from every recorded event of it (at least one)."""
    log = sorted(facts, key=lambda f: (f.occurred_at, f.seq))
    if not log:
        raise ValueError("a task has at least one event")
    task = MlTaskView(created_at=log[0].occurred_at)
    attempts: dict[int, AttemptView] = {}
    ended = False
    for fact in log:
        event = fact.event
        task.updated_at = event.occurred_at
        if isinstance(event, MlTaskSubmitted):
            task.task_type, task.priority = event.task_type, event.priority
            task.critical, task.submitted_by = event.critical, event.submitted_by
            task.deadline, task.input = event.deadline, list(event.input)
            task.created_at = event.occurred_at
        elif isinstance(event, ModelSelected):
            task.task_type = task.task_type or event.task_type
            view = attempts.setdefault(event.attempt, AttemptView(event.attempt, event.status))
            view.status, view.decision_reason = event.status, event.reason
            view.candidates = [c.model_dump(mode="json") for c in event.candidates]
            view.decided_at, view.probe = event.occurred_at, event.probe
            if event.node is not None:
                view.node_id, view.model, view.version = event.node, event.model, event.version
                view.family, view.command_id = event.family, event.command_id
                if not ended:
                    task.state = "running"
                    task.node_id, task.model = event.node, event.model
                    task.version, task.family = event.version, event.family
                    task.reason = event.reason
        else:
            task.task_type = task.task_type or event.task_type
            view = attempts.setdefault(event.attempt, AttemptView(event.attempt, "selected"))
            view.node_id = view.node_id or event.node_id
            view.model, view.version = view.model or event.model, view.version or event.version
            view.family = view.family or event.family
            view.command_id = view.command_id or event.command_id
            view.outcome, view.cause, view.attributed_to = (event.outcome, event.cause,
                                                            event.attributed_to)
            view.latency_ms, view.node_latency_ms = event.latency_ms, event.node_latency_ms
            view.prediction, view.confidence = event.prediction, event.confidence
            view.ended_at, view.reason = event.occurred_at, event.reason
            if not ended:
                task.cause, task.reason = event.cause, event.reason
                if event.node_id is not None:
                    task.node_id, task.model = event.node_id, event.model
                    task.version, task.family = event.version, event.family
                if event.final:
                    ended = True
                    task.state, task.finished_at = event.state, event.occurred_at
                    task.prediction, task.confidence = event.prediction, event.confidence
                    task.latency_ms = event.latency_ms
                elif task.state == "submitted":
                    task.state = "running"
    task.attempts = sum(1 for a in attempts.values() if a.node_id is not None)
    return task, attempts

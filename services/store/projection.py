"""Pure: what a task's recorded transitions say about the task and its steps.

The recorder keeps every TaskEvent and derives the task's row and its steps' rows from all of
them, ordered by when they happened (then by arrival). Events come from several services
and may arrive out of order; deriving from the whole log makes the result the same whatever
the order, and a replayed event (already in the log) changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from schemas.events.v1 import OpsTask

FINAL_STATES: Final = frozenset({"succeeded", "failed", "terminated"})
STEP_ENDED: Final = frozenset({"completed", "failed", "skipped"})


@dataclass(frozen=True)
class Fact:
    """One recorded transition, as the projection needs it."""

    seq: int  # arrival order: breaks ties between events of the same instant
    occurred_at: datetime
    state: str
    previous_state: str | None = None
    step_index: int | None = None
    step_state: str | None = None
    command_id: UUID | None = None
    reason: str = ""
    outputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskView:
    """The task-level fields derived from its transitions."""

    state: str
    reason: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    current_step: int | None


@dataclass(frozen=True)
class StepView:
    """A step's fields derived from the transitions about it."""

    index: int
    state: str
    command_id: UUID | None
    attempts: int
    outputs: dict[str, Any]
    started_at: datetime | None
    ended_at: datetime | None
    reason: str


@dataclass(frozen=True)
class PlannedStep:
    """A step as the task's plan describes it."""

    index: int
    name: str
    action: str
    action_args: dict[str, Any]
    guard: str | None
    node_id: str | None
    timeout_s: float
    max_attempts: int


def ordered(facts: Iterable[Fact]) -> list[Fact]:
    return sorted(facts, key=lambda f: (f.occurred_at, f.seq))


def task_view(facts: Sequence[Fact]) -> TaskView:
    """The task's state and times from all its transitions (at least one)."""
    log = ordered(facts)
    if not log:
        raise ValueError("a task has at least one transition")
    latest = log[-1]
    created = next((f for f in log if f.state == "created"), log[0])
    finished_at = None
    if latest.state in FINAL_STATES:
        # The start of the trailing run of final states: a refused control recorded on a
        # finished task does not move its end; a retried one that failed again does.
        i = len(log) - 1
        while i > 0 and log[i - 1].state in FINAL_STATES:
            i -= 1
        finished_at = log[i].occurred_at
    current_step = next((f.step_index for f in reversed(log) if f.step_index is not None),
                        None)
    return TaskView(state=latest.state, reason=latest.reason, created_at=created.occurred_at,
                    updated_at=latest.occurred_at, finished_at=finished_at,
                    current_step=current_step)


def since_restart(log: Sequence[Fact]) -> Sequence[Fact]:
    """The transitions of the latest run from the first step: after the last restart (an
    operator's control that ran the task again from nothing), else all of them."""
    for i in range(len(log) - 1, -1, -1):
        if _is_restart(log[i]):
            return log[i:]
    return log


def _is_restart(fact: Fact) -> bool:
    return fact.outputs.get("control") == "restart" and not fact.outputs.get("refused")


def restarted(facts: Sequence[Fact]) -> bool:
    """Whether an operator restarted the task (its steps then show the latest run only)."""
    return any(_is_restart(f) for f in facts)


def step_views(facts: Sequence[Fact]) -> dict[int, StepView]:
    """Every step some transition of the latest run reported a step state for, by index (a
    restart's earlier runs stay in the transitions, not in the steps)."""
    by_step: dict[int, list[Fact]] = {}
    for fact in since_restart(ordered(facts)):
        if fact.step_index is not None and fact.step_state is not None:
            by_step.setdefault(fact.step_index, []).append(fact)
    return {index: _step_view(index, log) for index, log in by_step.items()}


def _step_view(index: int, log: list[Fact]) -> StepView:
    commands: set[UUID] = set()
    outputs: dict[str, Any] = {}
    started_at: datetime | None = None
    command_id: UUID | None = None
    for fact in log:
        new_attempt = (fact.step_state == "started" and fact.command_id is not None
                       and fact.command_id not in commands)
        if new_attempt or fact.step_state == "skipped":
            # Outputs and start time are the latest attempt's: a failed attempt's cause
            # must not linger on the attempt that succeeded.
            outputs = {}
            started_at = fact.occurred_at if new_attempt else None
        if fact.command_id is not None:
            commands.add(fact.command_id)
            command_id = fact.command_id
        outputs.update(fact.outputs)
    latest = log[-1]
    # Several events of one attempt carry its command id (waiting for children, re-sent,
    # deadline extended): attempts count commands, not events.
    attempts = len({f.command_id for f in log
                    if f.step_state == "started" and f.command_id is not None})
    return StepView(
        index=index, state=latest.step_state or "", command_id=command_id,
        attempts=attempts, outputs=outputs, started_at=started_at,
        ended_at=latest.occurred_at if latest.step_state in STEP_ENDED else None,
        reason=latest.reason,
    )


def planned_steps(task: OpsTask) -> list[PlannedStep]:
    """The plan's steps as stored: the action's name apart from its arguments."""
    planned = []
    for step in task.steps:
        args = step.action.model_dump(mode="json")
        action = str(args.pop("action"))
        node = args.get("node_id")
        planned.append(PlannedStep(
            index=step.index, name=step.name, action=action, action_args=args,
            guard=step.guard, node_id=node if isinstance(node, str) else None,
            timeout_s=step.timeout_s, max_attempts=step.max_attempts,
        ))
    return planned

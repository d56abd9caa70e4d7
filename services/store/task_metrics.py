"""What the task store measures (common/metrics.py): every task transition it records, and
how many tasks are open in each state, by template.

Transitions are counted where they are recorded: the store takes each event once however
often it is delivered, and it alone knows every task's template (an event names only its
task). Open tasks are counted from the table, over the unfinished states only (an indexed
column, and few rows: finished tasks are the many).
"""

from __future__ import annotations

from typing import Final, get_args

from sqlalchemy import func, select

from common.metrics import TASK_TRANSITIONS, TASKS_OPEN, Instruments, instruments
from schemas.events.v1 import TaskEvent, TaskState
from services.store.db import Store
from services.store.models import Task

FINISHED: Final[frozenset[str]] = frozenset({"succeeded", "failed", "terminated"})
OPEN_STATES: Final[tuple[str, ...]] = tuple(s for s in get_args(TaskState) if s not in FINISHED)
# A task whose `created` event (with its plan) has not arrived has no template yet.
UNKNOWN_TEMPLATE: Final = "unknown"


def is_transition(event: TaskEvent) -> bool:
    """A change of the task's own state (a step's events leave it running)."""
    return event.previous_state != event.state


class TaskMetrics:
    """Counts recorded transitions and samples the open tasks."""

    def __init__(self, recorded: Instruments | None = None) -> None:
        recorded = recorded or instruments()
        self._transitions = recorded.counter(TASK_TRANSITIONS)
        self._open = recorded.gauge(TASKS_OPEN)
        self._seen: set[tuple[str, str]] = set()

    def recorded(self, event: TaskEvent, template: str | None) -> None:
        """`event` was recorded now (not a replay), for a task of `template`."""
        if is_transition(event):
            self._transitions.add(1, {"state": event.state,
                                      "template": template or UNKNOWN_TEMPLATE})

    async def sample_open(self, store: Store) -> None:
        async with store.session() as session:
            rows = (await session.execute(
                select(Task.state, Task.template, func.count())
                .where(Task.state.in_(OPEN_STATES))
                .group_by(Task.state, Task.template))).all()
        counts = {(str(state), template or UNKNOWN_TEMPLATE): int(n)
                  for state, template, n in rows}
        # A state and template with no open task left reads 0, not its last count.
        for key in self._seen - counts.keys():
            counts[key] = 0
        self._seen = set(counts)
        for (state, template), n in counts.items():
            self._open.set(n, {"state": state, "template": template})

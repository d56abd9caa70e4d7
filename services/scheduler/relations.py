"""Pure: whether the relations of a task let it start now, given the open tasks of its cluster.

Every task a template made carries its template's resolved relations (`OpsTask.relations`).
The scheduler keeps an entry per open task of a cluster (`OpenTask`: queued or running) and,
before it dispatches a task, asks `decide`:

- depends_on: the task waits for every task it depends on that was open when it was queued
  (`waits_for`, taken at enqueue by `dependencies`). Fixed at enqueue rather than "open now"
  so that a steady stream of new tasks of the other template cannot starve the dependent, and
  so that a failure is tied to one named task. When one of them failed (or was terminated: it
  did not do what the dependent relies on) and the rule says `fail`, the task fails with that
  task named; `proceed`: it goes on.
- exclusive_with: no running task of an excluded template within the rule's scope (the same
  cluster, pool or target). Either side's rule holds, so an exclusion declared by one
  template alone still holds both ways.
- default exclusion: no running task of another template on the same pool, unless either
  template lists the other in `concurrent_with`. Tasks of one template are bounded by its
  concurrency (a semaphore, not here).

Tasks without relations (child tasks of the executor) are neither checked nor indexed: they
run inside their parent, which was checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from schemas.events.v1 import OpsTask, RelationScope, TaskRelations

OpenState = Literal["queued", "running"]
# Final states that count as "did not do its work" for a task depending on it.
NOT_SUCCEEDED = frozenset({"failed", "terminated"})


@dataclass(frozen=True)
class OpenTask:
    """One open task of a cluster, as the relation gate sees it."""

    task_id: str
    template: str
    pool: str
    target: str
    relations: TaskRelations
    state: OpenState = "queued"
    # (task id, template) of the tasks it depends on that were open when it was queued.
    waits_for: tuple[tuple[str, str], ...] = ()
    # A running entry whose task's end is never seen lapses when its locks would (ms).
    lapses_at_ms: int = 0

    def to_json(self) -> str:
        return json.dumps({
            "task_id": self.task_id, "template": self.template, "pool": self.pool,
            "target": self.target, "state": self.state, "lapses_at_ms": self.lapses_at_ms,
            "waits_for": [list(w) for w in self.waits_for],
            "relations": self.relations.model_dump(mode="json"),
        })

    @classmethod
    def from_json(cls, raw: str) -> OpenTask:
        data = json.loads(raw)
        return cls(
            task_id=data["task_id"], template=data["template"], pool=data["pool"],
            target=data["target"], state=data["state"], lapses_at_ms=data["lapses_at_ms"],
            waits_for=tuple((str(i), str(t)) for i, t in data["waits_for"]),
            relations=TaskRelations.model_validate(data["relations"]),
        )

    def live(self, now_ms: int) -> bool:
        """Still holding others back: queued, or running and not lapsed."""
        return self.state == "queued" or self.lapses_at_ms > now_ms


def open_task(task: OpsTask, relations: TaskRelations,
              waits_for: Iterable[tuple[str, str]] = ()) -> OpenTask:
    """A queued task's entry."""
    return OpenTask(task_id=str(task.task_id), template=relations.template, pool=task.pool,
                    target=task.target, relations=relations, waits_for=tuple(waits_for))


def in_scope(scope: RelationScope, a: OpenTask, b: OpenTask) -> bool:
    """Two tasks of one cluster within a relation's scope."""
    if scope == "pool":
        return a.pool == b.pool
    if scope == "target":
        return a.target == b.target
    return True


def dependencies(me: OpenTask, others: Iterable[OpenTask]) -> tuple[tuple[str, str], ...]:
    """The open tasks `me` waits for: those of a template it depends on, within scope."""
    found: dict[tuple[str, str], None] = {}
    for other in others:
        if other.task_id == me.task_id:
            continue
        for rule in me.relations.depends_on:
            if rule.template == other.template and in_scope(rule.scope, me, other):
                found[(other.task_id, other.template)] = None
    return tuple(found)


def conflict(me: OpenTask, other: OpenTask, now_ms: int) -> str | None:
    """Why running `other` holds `me` back, or None."""
    if other.task_id == me.task_id or other.state != "running" or not other.live(now_ms):
        return None
    if other.template == me.template:
        return None  # its own concurrency bounds a template against itself
    running = f"task {other.task_id} ({other.template}) runs"
    rules = [(r.template, r.scope) for r in me.relations.exclusive_with
             if r.template == other.template]
    rules += [(other.template, r.scope) for r in other.relations.exclusive_with
              if r.template == me.template]
    for name, scope in rules:
        if in_scope(scope, me, other):
            where = "in the cluster" if scope == "cluster" else f"on the same {scope}"
            return f"exclusive_with {name} {where}: {running}"
    concurrent = (other.template in me.relations.concurrent_with
                  or me.template in other.relations.concurrent_with)
    if me.pool == other.pool and not concurrent:
        return (f"{running} on pool {me.pool}, and neither template is concurrent_with "
                "the other")
    return None


@dataclass(frozen=True)
class Decision:
    """What the relation gate says: admit, hold (why, and which blocker), or fail."""

    verdict: Literal["admit", "hold", "fail"]
    reason: str = ""
    # Names the blocker, so a hold is announced once per blocker.
    blocker: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


ADMIT = Decision("admit")


def decide(me: OpenTask, open_tasks: Iterable[OpenTask], outcomes: Mapping[str, str | None],
           now_ms: int) -> Decision:
    """The relation gate for `me`: its dependencies first, then what runs beside it.

    `outcomes`: the final state of each task in `me.waits_for` that is no longer open (None:
    not remembered any more; it counts as finished well).
    """
    by_id = {t.task_id: t for t in open_tasks}
    for task_id, template in me.waits_for:
        if task_id in by_id and by_id[task_id].live(now_ms):
            return Decision("hold", f"depends_on {template}: waits for task {task_id} to "
                            "finish", f"depends:{task_id}")
        outcome = outcomes.get(task_id)
        if outcome in NOT_SUCCEEDED and _on_failure(me, template) == "fail":
            return Decision("fail", f"depends_on {template}: task {task_id} {outcome}",
                            f"depends:{task_id}",
                            {"cause": "dependency_failed", "dependency": task_id})
    for other in by_id.values():
        reason = conflict(me, other, now_ms)
        if reason is not None:
            return Decision("hold", reason, f"runs:{other.task_id}")
    return ADMIT


def _on_failure(me: OpenTask, template: str) -> str:
    rules = [r.on_failure for r in me.relations.depends_on if r.template == template]
    return "fail" if "fail" in rules or not rules else "proceed"


def concurrency_hold(me: OpenTask, cluster: str, held: int) -> Decision:
    """The hold of a task whose template already runs its `concurrency` tasks."""
    limit = me.relations.concurrency
    return Decision("hold", f"concurrency: {held} of {limit} {me.template} task(s) run on "
                    f"{cluster}", f"concurrency:{me.template}")

"""The recorder turns TaskEvents into task records, once, whatever order they arrive in."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from common.errors import InfrastructureUnavailable
from schemas.events.v1 import TaskEvent
from services.store.db import Store, open_store
from services.store.models import AuditEntry, StepRecord, Task, Transition
from services.store.queries import get_task
from services.store.recorder import Recorder
from tests.unit.store.scenario import RESOURCES, Story, scale_in_story


async def record_all(store: Store, events: list[TaskEvent]) -> list[bool]:
    recorder = Recorder(store)
    return [await recorder.record(event) for event in events]


async def snapshot(store: Store, story: Story) -> dict[str, Any]:
    """Both tasks in full, without what depends on arrival (transition row ids)."""
    async with store.session() as session:
        found = {}
        for task in (story.parent, story.child):
            detail = await get_task(session, task.task_id)
            assert detail is not None
            dumped = detail.model_dump(mode="json")
            for transition in dumped["transitions"]:
                del transition["id"]
            found[str(task.task_id)] = dumped
        counts = {model.__tablename__: (await session.execute(
            select(func.count()).select_from(model))).scalar_one()
            for model in (Task, StepRecord, Transition, AuditEntry)}
    return {"tasks": found, "counts": counts}


async def test_a_parent_and_its_child_are_recorded(store: Store) -> None:
    story = scale_in_story()
    assert all(await record_all(store, story.events))
    async with store.session() as session:
        parent = await get_task(session, story.parent.task_id)
        child = await get_task(session, story.child.task_id)
    assert parent is not None
    assert child is not None

    assert (parent.state, parent.reason) == ("succeeded", "every step completed")
    assert (parent.cluster_id, parent.pool, parent.target) == ("c1", "default", "default")
    assert (parent.need_kind, parent.kind, parent.template) == ("scale_in", "scale_in",
                                                                 "scale_in.v1")
    assert parent.need_id == story.parent.need_id
    assert parent.priority == 6
    assert parent.parent_task_id is None
    assert parent.step_count == 2
    assert parent.created_at == story.events[0].occurred_at
    assert parent.finished_at == story.events[-1].occurred_at == parent.updated_at
    assert parent.evidence[0]["metric"] == "pool_gpu_utilization_pct"
    assert parent.plan == story.parent.model_dump(mode="json")
    assert [c.task_id for c in parent.children] == [story.child.task_id]

    remove, rebalance = parent.steps
    assert (remove.name, remove.action, remove.state, remove.attempts) == (
        "remove-capacity", "remove_capacity", "completed", 1)
    assert remove.command_id == story.commands["parent0"]
    # Initial and target resources, and the children's tally, in the step's outputs.
    assert remove.outputs == {**RESOURCES, "nodes": "node-003", "children": 1,
                              "succeeded": 1, "failed": 0}
    assert (rebalance.state, rebalance.guard, rebalance.attempts) == (
        "skipped", "nodes_out_of_range", 0)

    assert child.parent_task_id == story.parent.task_id
    assert (child.kind, child.target, child.state) == ("remove_node", "node-003",
                                                       "succeeded")
    drain, migrate, release = child.steps
    assert (drain.state, drain.attempts, drain.command_id) == (
        "completed", 2, story.commands["child0b"])
    assert drain.outputs == {"mode": "draining", "jobs": 0}  # not the failed attempt's cause
    assert drain.node_id == "node-003"
    assert drain.action_args == {"node_id": "node-003"}
    assert migrate.state == "skipped"
    assert migrate.outputs["guard"] == "node_has_jobs"
    assert release.outputs == {"released": "node-003", "provider": "local"}
    assert release.started_at is not None
    assert release.ended_at is not None
    assert child.children == []

    # Every transition, with who and why, oldest first.
    assert [(t.state, t.previous_state, t.actor) for t in parent.transitions[:4]] == [
        ("created", None, "templater"), ("queued", "created", "scheduler"),
        ("dispatched", "queued", "scheduler"), ("running", "dispatched", "executor")]
    failed = next(t for t in child.transitions if t.step_state == "failed")
    assert failed.reason == "drain attempt 1: unknown timeout; retry in 1 s"
    assert failed.outputs == {"cause": "timeout", "permanent": False}
    assert failed.command_id == story.commands["child0a"]
    assert len(parent.transitions) + len(child.transitions) == len(story.events)


async def test_replaying_every_event_changes_nothing(store: Store) -> None:
    story = scale_in_story()
    await record_all(store, story.events)
    before = await snapshot(store, story)
    assert await record_all(store, story.events) == [False] * len(story.events)
    # Each event twice in a row, as a redelivery after a lost commit would.
    assert not any(await record_all(store, [e for e in story.events for _ in (0, 1)]))
    assert await snapshot(store, story) == before
    assert before["counts"] == {"tasks": 2, "steps": 5, "transitions": len(story.events),
                                "audit": 0}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_arrival_order_does_not_matter(store: Store, seed: int) -> None:
    story = scale_in_story()
    await record_all(store, story.events)
    in_order = await snapshot(store, story)
    async with store.session() as session:
        await session.execute(delete(Task))  # steps and transitions go with their task
    shuffled = story.events[:]
    random.Random(seed).shuffle(shuffled)
    # Duplicates mixed in as well.
    assert sum(await record_all(store, shuffled + shuffled[:5])) == len(story.events)
    assert await snapshot(store, story) == in_order


async def test_a_late_created_event_fills_the_stub(store: Store) -> None:
    story = scale_in_story()
    child_events = [e for e in story.events if e.task_id == story.child.task_id]
    created, later = child_events[0], child_events[1:5]
    await record_all(store, later)
    async with store.session() as session:
        stub = await get_task(session, story.child.task_id)
    assert stub is not None
    assert (stub.state, stub.cluster_id, stub.plan, stub.target) == ("running", "c1", None,
                                                                      None)
    # The parent link rides on every event, so a stub knows its parent already.
    assert stub.parent_task_id == story.parent.task_id
    assert [(s.index, s.name, s.state) for s in stub.steps] == [(0, None, "started")]
    assert stub.created_at == later[0].occurred_at

    assert await record_all(store, [created]) == [True]
    async with store.session() as session:
        filled = await get_task(session, story.child.task_id)
    assert filled is not None
    assert filled.state == "running"  # the created event is older than the others
    assert filled.created_at == created.occurred_at
    assert (filled.target, filled.template, filled.step_count) == ("node-003",
                                                                    "scale_in.v1.remove", 3)
    assert [(s.name, s.state) for s in filled.steps] == [
        ("drain", "started"), ("migrate-jobs", "pending"), ("release", "pending")]


async def test_an_unreachable_database_is_infrastructure_unavailable() -> None:
    # Nothing listens on port 1: the event must not be committed (nor dead-lettered).
    store = open_store("postgresql+asyncpg://postgres@127.0.0.1:1/warden")
    try:
        with pytest.raises(InfrastructureUnavailable):
            await Recorder(store).on_task_event(scale_in_story().events[0])
    finally:
        await store.close()

"""Listing tasks: every filter, and pages that add up to the whole."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest

from services.store.db import Store
from services.store.queries import TaskFilter, get_task, list_tasks
from services.store.recorder import Recorder
from tests.unit.store.scenario import BASE, Story, scale_in_story


@pytest.fixture
async def stories(store: Store) -> list[Story]:
    """Three scale-ins: c1/node-003 done, c2/node-007 done an hour later, c1/node-005 two
    hours later and still running its child."""
    first = scale_in_story("c1", "node-003", start=BASE)
    second = scale_in_story("c2", "node-007", start=BASE + timedelta(hours=1))
    third = scale_in_story("c1", "node-005", start=BASE + timedelta(hours=2))
    # Up to the child's drain completed: the parent waits on its child, which runs.
    running = third.events[:14]
    assert running[-1].task_id == third.child.task_id
    assert running[-1].step_index == 0
    recorder = Recorder(store)
    for event in [*first.events, *second.events, *running]:
        await recorder.record(event)
    return [first, second, third]


async def listed(store: Store, f: TaskFilter, limit: int = 50,
                 offset: int = 0) -> tuple[list[str], int]:
    async with store.session() as session:
        rows, total = await list_tasks(session, f, limit, offset)
    return [f"{row.cluster_id}/{row.target}" for row in rows], total


# One recorded history serves every case (recording it is most of the test's time).
FILTERS: list[tuple[TaskFilter, list[str]]] = [
    (TaskFilter(), ["c1/node-005", "c1/default", "c2/node-007", "c2/default", "c1/node-003",
                    "c1/default"]),
    (TaskFilter(cluster="c2"), ["c2/node-007", "c2/default"]),
    # The child's target and its steps' nodes; the parent acts on the pool, not the node.
    (TaskFilter(node="node-003"), ["c1/node-003"]),
    (TaskFilter(node="node-999"), []),
    (TaskFilter(state="running"), ["c1/node-005", "c1/default"]),
    (TaskFilter(state="succeeded", cluster="c1"), ["c1/node-003", "c1/default"]),
    (TaskFilter(kind="remove_node"), ["c1/node-005", "c2/node-007", "c1/node-003"]),
    (TaskFilter(kind="scale_in", top_level_only=True),
     ["c1/default", "c2/default", "c1/default"]),
    (TaskFilter(top_level_only=True, cluster="c1"), ["c1/default", "c1/default"]),
    # Active in the window: created before `until`, changed at or after `since`.
    (TaskFilter(since=BASE + timedelta(minutes=30), until=BASE + timedelta(minutes=90)),
     ["c2/node-007", "c2/default"]),
    (TaskFilter(since=BASE + timedelta(hours=2)), ["c1/node-005", "c1/default"]),
    (TaskFilter(until=BASE + timedelta(seconds=1)), ["c1/default"]),
    # Naive times are UTC.
    (TaskFilter(until=(BASE + timedelta(seconds=1)).replace(tzinfo=None)), ["c1/default"]),
]


async def test_filters(store: Store, stories: list[Story]) -> None:
    for f, expected in FILTERS:
        names, total = await listed(store, f)
        assert (names, total) == (expected, len(expected)), f
    # The children of a parent.
    assert await listed(store, TaskFilter(parent=stories[1].parent.task_id)) == (
        ["c2/node-007"], 1)
    assert await listed(store, TaskFilter(parent=uuid4())) == ([], 0)


async def test_pages_add_up_to_the_whole(store: Store, stories: list[Story]) -> None:
    everything, _ = await listed(store, TaskFilter())
    pages = []
    for offset in range(0, 7, 2):
        names, total = await listed(store, TaskFilter(), limit=2, offset=offset)
        assert total == 6
        pages.extend(names)
    assert pages == everything
    assert await listed(store, TaskFilter(), limit=0) == (everything[:1], 6)  # clamped


async def test_a_running_task_in_full(store: Store, stories: list[Story]) -> None:
    async with store.session() as session:
        parent = await get_task(session, stories[2].parent.task_id)
        assert await get_task(session, uuid4()) is None
    assert parent is not None
    assert (parent.state, parent.finished_at, parent.current_step) == ("running", None, 0)
    assert [(s.state, s.attempts) for s in parent.steps] == [("started", 1), ("pending", 0)]
    child = parent.children[0]
    assert (child.state, child.finished_at) == ("running", None)

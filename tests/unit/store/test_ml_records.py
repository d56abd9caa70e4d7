"""ML task records: recorded once, whatever order the three topics deliver in; queryable."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, ModelSelected
from services.store.db import Store
from services.store.ml import MlRecorder, MlTaskFilter, get_ml_task, list_ml_tasks
from services.store.ml_projection import MlEventModel
from tests.contracts.examples import T0, example

SUBMITTED = example("ml_task_submitted", MlTaskSubmitted)
SELECTED = example("model_selected", ModelSelected)
OUTCOME = example("ml_task_outcome", MlTaskOutcome)


def story(task_id: UUID | None = None, *, start_s: float = 0.0, cluster: str = "local",
          second_node: str = "node-003", succeed: bool = True) -> list[MlEventModel]:
    """A task whose first attempt (mlp on node-002) fails as a model fault, and whose retry
    (knn on `second_node`) succeeds, or fails too."""
    task_id = task_id or uuid4()
    at = T0 + timedelta(seconds=start_s)

    def env(offset: float) -> dict[str, Any]:
        return {"event_id": uuid4(), "occurred_at": at + timedelta(seconds=offset),
                "subject": str(task_id), "task_id": task_id, "cluster_id": cluster}

    first_cmd, second_cmd = uuid4(), uuid4()
    second_final: dict[str, Any] = (
        {"outcome": "succeeded", "prediction": 0, "confidence": 0.97, "state": "succeeded",
         "reason": "digits-knn:1 answered 0"} if succeed else
        {"outcome": "failed", "cause": "node_fault", "attributed_to": "node",
         "prediction": None, "confidence": None, "state": "failed",
         "reason": "no retry: 2 of 2 used"})
    return [
        SUBMITTED.model_copy(update=env(0.0) | {"deadline": at + timedelta(seconds=10)}),
        SELECTED.model_copy(update=env(0.01) | {"command_id": first_cmd}),
        OUTCOME.model_copy(update=env(0.05) | {
            "command_id": first_cmd, "outcome": "failed", "cause": "model_fault",
            "attributed_to": "model", "prediction": None, "confidence": None, "final": False,
            "state": "running", "reason": "digits-mlp:2 on node-002: model_fault"}),
        SELECTED.model_copy(update=env(0.06) | {
            "attempt": 2, "command_id": second_cmd, "node": second_node, "model": "digits-knn",
            "version": "1", "family": "knn", "chosen": f"arm:digits-knn:1@{second_node}",
            "reason": "retry on another model"}),
        OUTCOME.model_copy(update=env(0.09) | {
            "attempt": 2, "command_id": second_cmd, "node_id": second_node,
            "model": "digits-knn", "version": "1", "family": "knn"} | second_final),
    ]


async def record_all(store: Store, events: list[MlEventModel]) -> list[bool]:
    recorder = MlRecorder(store)
    return [await recorder.record(event) for event in events]


async def detail(store: Store, task_id: UUID) -> dict[str, Any]:
    async with store.session() as session:
        found = await get_ml_task(session, task_id)
    assert found is not None
    dumped: dict[str, Any] = found.model_dump(mode="json")
    return dumped


async def test_a_task_with_a_retry_is_recorded(store: Store) -> None:
    events = story()
    task_id = events[0].task_id
    assert all(await record_all(store, events))
    task = await detail(store, task_id)
    assert (task["state"], task["task_type"], task["attempts"]) == ("succeeded", "digits", 2)
    assert (task["node_id"], task["model"], task["version"], task["family"]) == (
        "node-003", "digits-knn", "1", "knn")
    assert (task["prediction"], task["cause"], task["submitted_by"]) == (0, None, "alice")
    assert task["input"] == list(SUBMITTED.input)
    assert task["finished_at"] is not None
    first, second = task["attempt_list"]
    assert (first["node_id"], first["outcome"], first["cause"], first["attributed_to"]) == (
        "node-002", "failed", "model_fault", "model")
    assert len(first["candidates"]) == 2
    assert first["candidates"][0]["reason"].startswith("quarantined until")
    assert (second["node_id"], second["outcome"], second["status"]) == (
        "node-003", "succeeded", "selected")


async def test_any_order_gives_the_same_record_and_replays_change_nothing(
        store: Store) -> None:
    events = story()
    task_id = events[0].task_id
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)
    assert all(await record_all(store, shuffled))
    in_any_order = await detail(store, task_id)
    assert not any(await record_all(store, events))  # every one a replay
    assert await detail(store, task_id) == in_any_order
    assert in_any_order["state"] == "succeeded"


async def test_a_task_seen_only_by_its_outcome_is_a_stub_until_its_submission(
        store: Store) -> None:
    events = story(succeed=False)
    task_id = events[0].task_id
    await record_all(store, [events[-1]])
    stub = await detail(store, task_id)
    assert (stub["state"], stub["task_type"], stub["input"]) == ("failed", "digits", None)
    await record_all(store, events[:-1])
    task = await detail(store, task_id)
    assert (task["state"], task["cause"], task["submitted_by"]) == ("failed", "node_fault",
                                                                   "alice")


@pytest.fixture
async def recorded(store: Store) -> list[list[MlEventModel]]:
    stories = [story(start_s=0.0), story(start_s=60.0, cluster="c2", second_node="node-009"),
               story(start_s=120.0, succeed=False), story(start_s=180.0)[:2]]
    for events in stories:
        await record_all(store, events)
    return stories


@pytest.mark.parametrize(
    ("task_filter", "expected"),
    [
        (MlTaskFilter(), [3, 2, 1, 0]),
        (MlTaskFilter(state="succeeded"), [1, 0]),
        (MlTaskFilter(state="failed"), [2]),
        (MlTaskFilter(state="running"), [3]),
        (MlTaskFilter(cluster="c2"), [1]),
        (MlTaskFilter(node="node-009"), [1]),
        (MlTaskFilter(node="node-002"), [3, 2, 1, 0]),  # every first attempt ran there
        (MlTaskFilter(model="digits-knn"), [2, 1, 0]),
        (MlTaskFilter(task_type="speech"), []),
        (MlTaskFilter(since=T0 + timedelta(seconds=100)), [3, 2]),
        (MlTaskFilter(until=T0 + timedelta(seconds=100)), [1, 0]),
    ],
)
async def test_filters(store: Store, recorded: list[list[MlEventModel]],
                       task_filter: MlTaskFilter, expected: list[int]) -> None:
    async with store.session() as session:
        rows, total = await list_ml_tasks(session, task_filter)
    assert [row.task_id for row in rows] == [recorded[i][0].task_id for i in expected]
    assert total == len(expected)


async def test_pages_add_up(store: Store, recorded: list[list[MlEventModel]]) -> None:
    seen = []
    async with store.session() as session:
        for offset in range(0, 4, 3):
            rows, total = await list_ml_tasks(session, MlTaskFilter(), limit=3, offset=offset)
            seen += [row.task_id for row in rows]
            assert total == 4
    assert seen == [events[0].task_id for events in reversed(recorded)]

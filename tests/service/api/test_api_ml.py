"""ML tasks through the API: submissions are published, records and models are readable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from schemas.events.v1 import MlTaskSubmitted, NodeReport
from schemas.topics import Topic
from services.router.registry import Registry
from services.store.ml import MlRecorder
from tests.contracts.examples import DIGIT, example
from tests.service.api.conftest import USERS, Api, read_events
from tests.unit.store.test_ml_records import story


@pytest.mark.usefixtures("kafka_bootstrap")  # the submission is read back from the broker
async def test_a_submission_is_published_for_the_router(api: Api) -> None:
    response = await api.post("/api/ml/tasks", {"task_type": "digits", "input": DIGIT,
                                                "deadline_s": 5.0, "priority": 2})
    assert response.status_code == 202, response.text
    accepted = response.json()
    [raw] = await read_events(api.settings.kafka_bootstrap_servers, api.settings.namespace,
                              Topic.ML_TASKS_SUBMITTED, 1)
    event = MlTaskSubmitted.model_validate_json(raw)
    assert str(event.task_id) == accepted["task_id"] == event.subject
    assert (event.task_type, event.input, event.priority, event.critical) == (
        "digits", DIGIT, 2, False)
    assert (event.submitted_by, event.cluster_id) == (USERS["operator"], "c1")
    assert event.deadline - event.occurred_at == timedelta(seconds=5)


@pytest.mark.parametrize(
    "body",
    [
        {"task_type": "digits", "input": []},
        {"task_type": "digits", "input": [0.0] * 1_025},
        {"task_type": "digits", "input": ["1"] * 64, "extra": 1},
        {"task_type": "bad type", "input": [0.0]},
        {"task_type": "digits", "input": [0.0], "deadline_s": 0},
        {"task_type": "digits", "input": [0.0], "priority": 10},
    ],
)
async def test_bad_submissions_are_422(api: Api, body: dict[str, Any]) -> None:
    response = await api.post("/api/ml/tasks", body)
    assert response.status_code == 422, body


async def test_ml_tasks_are_listed_and_shown_from_the_store(api: Api) -> None:
    recorder = MlRecorder(api.runtime.store)
    done, failed = story(start_s=0.0), story(start_s=30.0, succeed=False)
    for event in [*done, *failed]:
        await recorder.record(event)
    page = (await api.get("/api/ml/tasks")).json()
    assert page["total"] == 2
    assert [r["task_id"] for r in page["items"]] == [str(failed[0].task_id),
                                                      str(done[0].task_id)]
    only_failed = (await api.get("/api/ml/tasks", state="failed")).json()["items"]
    assert [r["task_id"] for r in only_failed] == [str(failed[0].task_id)]
    assert (await api.get("/api/ml/tasks", model="digits-knn")).json()["total"] == 2
    detail = (await api.get(f"/api/ml/tasks/{done[0].task_id}")).json()
    assert detail["state"] == "succeeded"
    assert [a["node_id"] for a in detail["attempt_list"]] == ["node-002", "node-003"]
    assert detail["attempt_list"][0]["candidates"][1]["reason"] == "chosen"
    missing = await api.get(f"/api/ml/tasks/{done[1].event_id}")
    assert missing.status_code == 404
    assert (await api.get("/api/ml/tasks", state="exploded")).status_code == 422


async def test_the_models_each_node_serves_are_shown_with_their_statistics(api: Api) -> None:
    report = example("node_report", NodeReport)
    fresh = report.model_copy(update={"cluster_id": "c1", "occurred_at": report.occurred_at
                                      .now(report.occurred_at.tzinfo)})
    await Registry(api.runtime.redis, api.runtime.keys, require_registration=False).update(fresh)
    view = (await api.get("/api/ml/models")).json()
    assert view["cluster_id"] == "c1"
    [arm] = view["arms"]
    assert (arm["node_id"], arm["model"], arm["version"], arm["family"]) == (
        "node-002", "digits-mlp", "2", "mlp")
    assert (arm["ready"], arm["quarantine"], arm["inflight"], arm["n_eff"]) == (
        True, "closed", 0, 0.0)
    assert 0.0 < arm["mean"] <= 1.0

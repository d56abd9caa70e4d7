"""Controls: checked against the store (409 with the reason), audited, then published as a
TaskControl on the real Kafka topic."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest

from schemas.events.v1 import TaskControl
from schemas.topics import Topic
from services.api.settings import ApiSettings
from tests.service.api.conftest import DEAD_KAFKA, USERS, Api, read_events, start
from tests.unit.api.stories import Ending, history, offline_task

pytestmark = pytest.mark.usefixtures("kafka_bootstrap")


async def controls(api: Api, count: int) -> list[TaskControl]:
    raw = await read_events(api.settings.kafka_bootstrap_servers, api.settings.namespace,
                            Topic.OPS_TASK_CONTROL, count)
    return [TaskControl.model_validate_json(body) for body in raw]


async def test_a_legal_pause_is_audited_and_published_with_the_operator_as_actor(
        api: Api) -> None:
    task = offline_task()
    await api.record(history(task, "running"))

    response = await api.post(f"/api/tasks/{task.task_id}/pause",
                              {"reason": "  checking the NFS mount  "})
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["expected_state"] == "paused"
    assert accepted["note"] == "pauses when the running step ends"

    [control] = await controls(api, 1)
    assert control.event_id == UUID(accepted["control_event_id"])
    assert control.task_id == task.task_id
    assert control.subject == str(task.task_id)
    assert control.cluster_id == "c1"
    assert control.action == "pause"
    assert control.step_index is None
    assert control.actor == USERS["operator"]
    assert control.reason == "checking the NFS mount"

    [entry] = await api.audit()
    assert (entry.actor, entry.role, entry.action, entry.target, entry.reason,
            entry.result) == (USERS["operator"], "operator", "pause", f"task/{task.task_id}",
                              "checking the NFS mount", "accepted")
    assert entry.detail["control_event_id"] == accepted["control_event_id"]


async def test_an_admin_jumps_a_failed_task_to_a_step(api: Api) -> None:
    task = offline_task()
    await api.record(history(task, "failed"))
    response = await api.post(f"/api/tasks/{task.task_id}/jump",
                              {"reason": "the drain was done by hand", "step_index": 2},
                              role="admin")
    assert response.status_code == 202, response.text
    [control] = await controls(api, 1)
    assert (control.action, control.step_index, control.actor) == ("jump", 2, USERS["admin"])


@pytest.mark.parametrize("ending", ["failed", "terminated"])
async def test_an_operator_restarts_a_failed_or_terminated_task(api: Api, ending: Ending) -> None:
    task = offline_task()
    await api.record(history(task, ending))
    response = await api.post(f"/api/tasks/{task.task_id}/restart",
                              {"reason": "the new firmware is in"})
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert (accepted["action"], accepted["expected_state"]) == ("restart", "running")
    [control] = await controls(api, 1)
    assert (control.action, control.step_index, control.actor) == (
        "restart", None, USERS["operator"])
    [entry] = await api.audit()
    assert (entry.action, entry.result) == ("restart", "accepted")


@pytest.mark.parametrize(("ending", "action", "body", "why"), [
    ("running", "restart", {}, "only a failed or terminated task can be restarted; it is "
                               "running"),
    ("running", "resume", {}, "cannot resume a task that is running: the task is running, "
                              "not paused"),
    ("succeeded", "retry", {}, "only a failed task can be retried; it is succeeded"),
    ("succeeded", "terminate", {}, "the task is already succeeded"),
    ("running", "jump", {"step_index": 1}, "the task is running: pause first"),
    ("paused", "jump", {"step_index": 9}, "step 9 is out of range 0..3"),
    ("queued", "retry", {}, "the task has not reached the executor"),
])
async def test_an_illegal_control_is_409_with_the_reason_and_audited(
        api: Api, ending: Ending, action: str, body: dict[str, object], why: str) -> None:
    task = offline_task()
    await api.record(history(task, ending))
    response = await api.post(f"/api/tasks/{task.task_id}/{action}",
                              {"reason": "trying"} | body, role="admin")
    assert response.status_code == 409
    assert why in response.json()["detail"]
    [entry] = await api.audit()
    assert entry.action == action
    assert entry.result.startswith("409 refused: ")
    assert entry.detail["state"] == ending


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": "x" * 501},
                                  {"reason": "ok", "extra": 1}, {"reason": 5}])
async def test_a_control_without_a_proper_reason_is_422_and_audited(
        api: Api, body: dict[str, object]) -> None:
    task = offline_task()
    await api.record(history(task, "running"))
    response = await api.post(f"/api/tasks/{task.task_id}/pause", body)
    assert response.status_code == 422
    [entry] = await api.audit()
    assert (entry.actor, entry.action, entry.result) == (USERS["operator"], "invalid_request",
                                                         "422")
    assert entry.detail["fields"]


async def test_jump_needs_a_step(api: Api) -> None:
    task = offline_task()
    await api.record(history(task, "paused"))
    response = await api.post(f"/api/tasks/{task.task_id}/jump", {"reason": "x"}, role="admin")
    assert response.status_code == 422


async def test_a_control_for_an_unknown_task_is_404_and_audited(api: Api) -> None:
    unknown = uuid4()
    response = await api.post(f"/api/tasks/{unknown}/terminate", {"reason": "cleanup"})
    assert response.status_code == 404
    [entry] = await api.audit()
    assert (entry.action, entry.target, entry.result) == ("terminate", f"task/{unknown}",
                                                          "404 no such task")


@pytest.fixture
async def api_without_kafka(api_settings: ApiSettings) -> AsyncIterator[Api]:
    settings = api_settings.model_copy(update={"kafka_bootstrap_servers": DEAD_KAFKA,
                                               "publish_timeout_s": 3.0})
    async for running in start(settings):
        yield running


async def test_a_control_kafka_does_not_take_is_503_and_audited_twice(
        api_without_kafka: Api) -> None:
    api = api_without_kafka
    task = offline_task()
    await api.record(history(task, "running"))
    response = await api.post(f"/api/tasks/{task.task_id}/terminate", {"reason": "stuck"})
    assert response.status_code == 503
    assert "nothing was changed" in response.json()["detail"]
    # Reads still work without Kafka.
    assert (await api.get(f"/api/tasks/{task.task_id}")).status_code == 200
    assert [e.result for e in await api.audit()] == ["accepted", "503 not published"]

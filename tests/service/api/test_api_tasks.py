"""Listing and showing tasks from the store (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

from tests.service.api.conftest import Api, auth
from tests.unit.api.stories import START, history, offline_task


async def test_tasks_are_listed_newest_first_filtered_and_paginated(api: Api) -> None:
    older = offline_task("node-001", start=START)
    newer = offline_task("node-002", start=START + timedelta(minutes=5))
    other = offline_task("node-009", cluster="c2", start=START + timedelta(minutes=9))
    child = offline_task("node-002", parent=newer.task_id, start=START + timedelta(minutes=6))
    await api.record(history(older, "succeeded") + history(newer, "running")
                     + history(other, "failed") + history(child, "queued"))

    page = (await api.get("/api/tasks")).json()
    assert page["total"] == 4
    assert [r["task_id"] for r in page["items"]] == [
        str(t.task_id) for t in (other, child, newer, older)]

    async def listed(**params: str | int | bool) -> list[str]:
        response = await api.client.get("/api/tasks", params=params, headers=auth("viewer"))
        assert response.status_code == 200, response.text
        return [r["task_id"] for r in response.json()["items"]]

    assert await listed(cluster="c2") == [str(other.task_id)]
    assert await listed(state="failed") == [str(other.task_id)]
    assert await listed(node="node-002") == [str(child.task_id), str(newer.task_id)]
    assert await listed(kind="offline", top_level=True) == [
        str(t.task_id) for t in (other, newer, older)]
    assert await listed(parent=str(newer.task_id)) == [str(child.task_id)]
    assert await listed(until=(START + timedelta(minutes=1)).isoformat()) == [
        str(older.task_id)]
    assert await listed(since="2026-11-30T09:08:00") == [str(other.task_id)]
    assert await listed(limit=2, offset=1) == [str(child.task_id), str(newer.task_id)]
    assert (await api.get("/api/tasks", limit=2)).json()["total"] == 4


async def test_bad_filters_are_422(api: Api) -> None:
    bad: list[dict[str, str | int]] = [
        {"state": "exploded"}, {"limit": 0}, {"limit": 501}, {"offset": -1},
        {"parent": "not-a-uuid"}, {"node": "bad node"}, {"since": "yesterday"}]
    for params in bad:
        response = await api.client.get("/api/tasks", params=params, headers=auth("viewer"))
        assert response.status_code == 422, params


async def test_a_task_is_shown_with_steps_transitions_children_and_evidence(api: Api) -> None:
    parent = offline_task("node-002")
    child = offline_task("node-002", parent=parent.task_id)
    await api.record(history(parent, "failed") + history(child, "succeeded"))

    response = await api.get(f"/api/tasks/{parent.task_id}")
    assert response.status_code == 200
    task = response.json()
    assert task["state"] == "failed"
    assert task["template"] == "offline.v2"
    assert task["step_count"] == 4
    assert [s["name"] for s in task["steps"]] == ["drain", "offline", "add-capacity",
                                                  "migrate-jobs"]
    assert [s["state"] for s in task["steps"]] == ["completed", "failed", "pending", "pending"]
    assert task["evidence"][0]["metric"] == "node_fault_count"
    assert task["plan"]["task_id"] == str(parent.task_id)
    assert [t["state"] for t in task["transitions"]][:3] == ["created", "queued", "dispatched"]
    assert task["transitions"][-1]["reason"] == "step offline failed: not_drained"
    assert [c["task_id"] for c in task["children"]] == [str(child.task_id)]
    assert task["children"][0]["state"] == "succeeded"


async def test_an_unknown_task_is_404(api: Api) -> None:
    assert (await api.get(f"/api/tasks/{uuid4()}")).status_code == 404
    assert (await api.get("/api/tasks/not-a-uuid")).status_code == 422


async def test_the_openapi_document_names_every_route_and_the_bearer_scheme(api: Api) -> None:
    document = (await api.get("/openapi.json", role=None)).json()
    paths = set(document["paths"])
    assert {"/api/v1/tasks", "/api/v1/tasks/{task_id}", "/api/v1/tasks/{task_id}/pause",
            "/api/v1/tasks/{task_id}/jump", "/api/v1/templates", "/api/v1/templates/{name}",
            "/api/v1/templates/validate", "/api/v1/nodes", "/api/v1/clusters",
            "/api/v1/breakers/reset", "/api/v1/audit", "/api/v1/capacity", "/healthz", "/livez",
            "/readyz"} <= paths
    # The deprecated aliases answer, but are not documented.
    assert {p for p in paths if p.startswith("/api/") and not p.startswith("/api/v1/")} == set()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


async def test_health_needs_no_token_and_the_console_is_served(api: Api) -> None:
    assert (await api.get("/healthz", role=None)).json() == {"status": "ok"}
    page = await api.get("/", role=None)
    assert page.status_code == 200
    assert "ClusterWarden" in page.text


async def test_an_oversized_body_is_refused_before_it_is_read(api: Api) -> None:
    response = await api.post(f"/api/tasks/{uuid4()}/pause", {"reason": "x" * 300_000})
    assert response.status_code == 413

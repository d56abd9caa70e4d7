"""The API's conventions against the real API: every route under `/api/v1`, the unversioned
paths as deprecated aliases (answered alike, token needed alike, with `Deprecation` and a
`Link` to their successor), and every kind of error answered as RFC 9457 problem details."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import httpx
import pytest

from services.api.app import create_api
from services.api.publisher import PublishFailed
from services.api.settings import ApiSettings
from tests.service.api.conftest import Api, auth, clean_redis
from tests.unit.api.stories import history, offline_task

PROBLEMS = "https://clusterwarden.dev/problems/"


def problem(response: httpx.Response, status: int, kind: str, instance: str) -> dict[str, Any]:
    """The response's problem document, checked member by member; returned for the rest."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == PROBLEMS + kind
    assert body["status"] == status
    for text in ("title", "detail"):
        assert isinstance(body[text], str)
        assert body[text].strip()
    assert body["instance"] == instance
    return body


async def test_a_route_answers_under_v1_and_its_alias_says_it_is_deprecated(api: Api) -> None:
    task = offline_task("node-001")
    await api.record(history(task, "running"))
    current = await api.get(f"/api/v1/tasks/{task.task_id}")
    alias = await api.get(f"/api/tasks/{task.task_id}")
    assert current.status_code == alias.status_code == 200
    assert current.json() == alias.json()
    assert "deprecation" not in current.headers
    assert alias.headers["deprecation"] == "true"
    assert alias.headers["link"] == (f'</api/v1/tasks/{task.task_id}>; '
                                     'rel="successor-version"')
    # A query is kept; a change through an alias is the same change.
    listed = await api.get("/api/tasks", state="running")
    assert [t["task_id"] for t in listed.json()["items"]] == [str(task.task_id)]
    started = await api.post("/api/maintenance/start", {"cluster": "c1", "reason": "alias"})
    assert started.status_code == 201, started.text
    assert [w["window_id"] for w in (await api.get("/api/v1/maintenance")).json()["windows"]
            ] == [started.json()["window_id"]]


async def test_both_paths_need_a_token_and_the_alias_refusal_is_deprecated_too(
        api: Api) -> None:
    for path in ("/api/tasks", "/api/v1/tasks"):
        refused = await api.get(path, role=None)
        body = problem(refused, 401, "unauthenticated", "/api/v1/tasks")
        assert body["reason"] == "no_token"
        assert refused.headers["www-authenticate"] == "Bearer"
        assert ("deprecation" in refused.headers) == (path == "/api/tasks")
    # The audit log (the first refusal of the window: the alias's) names the route's one path.
    assert [e.target for e in await api.audit()] == ["/api/v1/tasks"]


async def test_forbidden_not_found_and_conflict_are_problems(api: Api) -> None:
    forbidden = await api.post(f"/api/v1/tasks/{uuid4()}/jump", {"reason": "r",
                                                                  "step_index": 1})
    assert "admin" in problem(forbidden, 403, "forbidden", forbidden.url.path)["detail"]
    unknown = uuid4()
    missing = await api.get(f"/api/v1/tasks/{unknown}")
    assert problem(missing, 404, "not-found", f"/api/v1/tasks/{unknown}")["detail"] == (
        f"no task {unknown}")
    # A path no route has: the router's own 404, under /api or not.
    problem(await api.get("/api/v1/nothing"), 404, "not-found", "/api/v1/nothing")
    problem(await api.get("/nothing.js", role=None), 404, "not-found", "/nothing.js")
    enrol = {"cluster_id": "c1", "node_id": "node-009"}
    assert (await api.post("/api/v1/nodes/enroll", enrol, role="node")).status_code == 200
    again = await api.post("/api/v1/nodes/enroll", enrol, role="node")
    assert "already" in problem(again, 409, "conflict", "/api/v1/nodes/enroll")["detail"]


async def test_an_invalid_request_names_each_field_in_detail_and_errors(api: Api) -> None:
    task = offline_task("node-001")
    response = await api.post(f"/api/v1/tasks/{task.task_id}/pause", {"reason": ""})
    body = problem(response, 422, "invalid-request", f"/api/v1/tasks/{task.task_id}/pause")
    assert body["detail"].startswith("body.reason: ")
    assert [e["loc"] for e in body["errors"]] == [["body", "reason"]]
    query = await api.get("/api/v1/tasks", limit=0)
    assert problem(query, 422, "invalid-request", "/api/v1/tasks")["errors"][0]["loc"] == [
        "query", "limit"]


async def test_an_invalid_template_keeps_its_problems_field_by_field(api: Api) -> None:
    response = await api.post("/api/v1/templates/validate", {"yaml": "name: [unclosed"})
    body = problem(response, 422, "invalid-template", "/api/v1/templates/validate")
    assert [p["field"] for p in body["problems"]] == ["yaml"]


async def test_a_body_too_large_is_a_problem(api: Api) -> None:
    response = await api.post(f"/api/v1/tasks/{uuid4()}/pause", {"reason": "x" * 300_000})
    problem(response, 413, "body-too-large", response.url.path)


async def test_kafka_unreachable_is_a_503_problem(api: Api, monkeypatch: pytest.MonkeyPatch,
                                                  ) -> None:
    async def unreachable(*_: object) -> None:
        raise PublishFailed("no broker")

    monkeypatch.setattr(api.runtime.publisher, "publish", unreachable)
    response = await api.post("/api/v1/ml/tasks", {"task_type": "digits", "input": [0.0] * 64})
    assert "try again" in problem(response, 503, "unavailable", "/api/v1/ml/tasks")["detail"]


async def test_an_unexpected_failure_is_a_500_problem_that_tells_nothing_of_it(
        api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_api(api_settings)
    async with app.router.lifespan_context(app):
        def broken() -> None:
            raise RuntimeError("postgres://warden:s3cret@db")

        monkeypatch.setattr(app.state.runtime.store, "session", broken)
        # As a server does: the exception is logged, the client gets the 500.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            response = await client.get("/api/tasks", headers=auth("viewer"))
        await clean_redis(app.state.runtime)
    body = problem(response, 500, "internal-error", "/api/v1/tasks")
    assert "s3cret" not in response.text
    assert body["detail"] == "the API failed on this request; its log has the cause"


async def test_the_openapi_document_gives_errors_as_problem_details(api: Api) -> None:
    document = (await api.get("/openapi.json", role=None)).json()
    responses = document["paths"]["/api/v1/templates/validate"]["post"]["responses"]
    assert set(responses["4XX"]["content"]) == {"application/problem+json"}
    assert set(responses["422"]["content"]) == {"application/problem+json"}
    invalid = responses["422"]["content"]["application/problem+json"]["schema"]["$ref"]
    assert invalid.endswith("/Invalid")
    assert "HTTPValidationError" not in document["components"]["schemas"]

"""Authentication and roles: 401 without a known token, 403 below the route's role, both
audited in the hash-chained log (401s at a bounded rate)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from services.api.auth import ROLES, Role
from tests.service.api.conftest import TOKENS, USERS, Api

TASK = str(uuid4())
REASON = {"reason": "checking roles"}
# Every route and the least role that may call it (the body is valid, or nearly).
ROUTES: list[tuple[str, str, Any, Role]] = [
    ("GET", "/api/me", None, "viewer"),
    ("GET", "/api/tasks", None, "viewer"),
    ("GET", f"/api/tasks/{TASK}", None, "viewer"),
    ("GET", "/api/nodes", None, "viewer"),
    ("GET", "/api/clusters", None, "viewer"),
    ("GET", "/api/breakers", None, "viewer"),
    ("GET", "/api/templates", None, "viewer"),
    ("GET", "/api/templates/offline", None, "viewer"),
    ("GET", "/api/capacity", None, "viewer"),
    ("GET", "/api/ml/tasks", None, "viewer"),
    ("GET", f"/api/ml/tasks/{TASK}", None, "viewer"),
    ("GET", "/api/ml/models", None, "viewer"),
    ("POST", "/api/ml/tasks", {"task_type": "digits", "input": [0.0] * 64}, "operator"),
    ("POST", f"/api/tasks/{TASK}/pause", REASON, "operator"),
    ("POST", f"/api/tasks/{TASK}/resume", REASON, "operator"),
    ("POST", f"/api/tasks/{TASK}/retry", REASON, "operator"),
    ("POST", f"/api/tasks/{TASK}/terminate", REASON, "operator"),
    ("POST", "/api/templates/validate", {"yaml": "name: x"}, "operator"),
    ("POST", f"/api/tasks/{TASK}/jump", REASON | {"step_index": 0}, "admin"),
    ("PUT", "/api/templates/offline", REASON | {"yaml": "name: x"}, "admin"),
    ("POST", "/api/breakers/reset", REASON | {"cluster": "c1", "kind": "offline"}, "admin"),
    ("GET", "/api/audit", None, "admin"),
]


async def _call(api: Api, method: str, path: str, body: Any,
                headers: dict[str, str]) -> int:
    response = await api.client.request(method, path, json=body, headers=headers)
    return response.status_code


async def test_each_route_needs_its_role(api: Api) -> None:
    for method, path, body, least in ROUTES:
        for role in ROLES:
            status = await _call(api, method, path, body,
                                 {"Authorization": f"Bearer {TOKENS[role]}"})
            if ROLES.index(role) < ROLES.index(least):
                assert status == 403, (method, path, role, status)
            else:
                assert status not in (401, 403), (method, path, role, status)


async def test_without_a_known_token_every_route_is_401(api: Api) -> None:
    for method, path, body, _ in ROUTES:
        for headers in ({}, {"Authorization": "Bearer not-a-configured-token"},
                        {"Authorization": f"Basic {TOKENS['admin']}"}):
            response = await api.client.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert response.json()["reason"] in ("no_token", "unknown_token")


async def test_refusals_are_audited_without_the_token(api: Api) -> None:
    await api.client.get("/api/tasks", headers={"Authorization": "Bearer guessed-token"})
    await api.client.get("/api/tasks")
    await api.post(f"/api/v1/tasks/{TASK}/jump", REASON | {"step_index": 1}, role="operator")
    entries = await api.audit()
    assert [(e.actor, e.role, e.action, e.result) for e in entries] == [
        ("anonymous", "none", "authenticate", "401"),
        ("anonymous", "none", "authenticate", "401"),
        (USERS["operator"], "operator", "authorize", "403"),
    ]
    # One entry per source and reason in a window (tests/service/api/test_api_door.py).
    assert entries[0].reason.startswith("unknown bearer token; later ones from 127.0.0.1")
    assert entries[1].reason.startswith("no bearer token; later ones from 127.0.0.1")
    assert entries[2].target == f"/api/v1/tasks/{TASK}/jump"
    assert entries[2].reason == "needs role admin, has operator"
    assert entries[2].detail["ip"] == "127.0.0.1"
    for entry in entries:
        assert "guessed-token" not in entry.model_dump_json()
    verified = (await api.get("/api/audit", role="admin", verify=True)).json()
    assert verified["chain"]["ok"] is True
    assert verified["total"] == 3


async def test_me_says_who_the_caller_is_and_with_which_role(api: Api) -> None:
    for role in ROLES:
        response = await api.get("/api/me", role=role)
        if role == "node":  # a bootstrap token reads nothing, not even this
            assert response.status_code == 403
            continue
        assert response.status_code == 200
        assert response.json() == {"user": USERS[role], "role": role}

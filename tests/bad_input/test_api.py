"""Bad calls at the API (B24, B26..B29): the app on a real store (SQLite, then PostgreSQL)
and the real redis-server, requests through httpx's ASGI transport (tests/service/api).

Beyond the status, each refusal is checked to have changed nothing: the task's recorded
state, the breaker, the active template version; and no control was vouched for, which is
what the executor would need to act on one (services/shared/vouchers.py, B32).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from pydantic import SecretStr

from schemas.events.v1 import OpsTask
from services.api.auth import Role
from services.api.settings import ApiSettings
from services.scheduler.breaker import Outcome
from services.store.template_versions import load_active
from tests.service.api.conftest import TOKENS, USERS, Api, start
from tests.service.api.test_api_door import Clock
from tests.service.api.test_api_templates import problems
from tests.unit.api.stories import Ending, history, offline_task
from tests.unit.api.test_api_templates import BUILT_IN

REASON = {"reason": "checking bad input"}


async def vouchers(api: Api) -> int:
    """How many controls the API vouched for (the executor applies no other)."""
    rt = api.runtime
    return len([k async for k in rt.redis.scan_iter(match=f"{rt.keys.prefix}control-voucher:*")])


async def recorded(api: Api, ending: Ending) -> OpsTask:
    task = offline_task()
    await api.record(history(task, ending))
    return task


async def state_of(api: Api, task: OpsTask) -> str:
    response = await api.get(f"/api/tasks/{task.task_id}")
    assert response.status_code == 200
    state: str = response.json()["state"]
    return state


# ---------------------------------------------------------------- B27 authentication

EXPIRING = "expiring-token-0123456789"


async def test_without_a_valid_token_every_call_is_401_with_its_reason_and_audited_B27(
        api_settings: ApiSettings) -> None:
    """B27: no token, another scheme, an unknown token and an expired one are 401 with the
    reason, before any body is read; each (source, reason) is audited. The tokens are bearer
    tokens of the API's own list: they carry no audience, so "wrong audience" is an unknown
    token here."""
    entry = f"{EXPIRING}:erin:operator:issued=20261202T130000Z:expires=20261202T140000Z"
    settings = api_settings.model_copy(update={"tokens": SecretStr(
        f"{api_settings.tokens.get_secret_value()},{entry}")})
    clock = Clock(datetime(2026, 12, 2, 14, 0, tzinfo=UTC))  # the token's expiry
    async for api in start(settings, clock):
        task = await recorded(api, "running")
        path = f"/api/tasks/{task.task_id}/terminate"
        calls = [({}, "no_token"),
                 ({"Authorization": f"Basic {TOKENS['admin']}"}, "no_token"),
                 ({"Authorization": "Bearer not-a-configured-token"}, "unknown_token"),
                 ({"Authorization": f"Bearer {EXPIRING}"}, "token_expired")]
        for headers, reason in calls:
            response = await api.client.post(path, json=REASON, headers=headers)
            assert response.status_code == 401, headers
            assert response.json()["reason"] == reason
            assert response.headers["WWW-Authenticate"] == "Bearer"
        entries = await api.audit()
        assert sorted((e.action, e.result, e.detail["refusal"]) for e in entries) == [
            ("authenticate", "401", "no_token"), ("authenticate", "401", "token_expired"),
            ("authenticate", "401", "unknown_token")]
        for e in entries:
            assert EXPIRING not in e.model_dump_json()
            assert TOKENS["admin"] not in e.model_dump_json()
        assert await state_of(api, task) == "running"
        assert await vouchers(api) == 0


# ---------------------------------------------------------------- B28 roles


async def test_a_call_above_the_callers_role_is_403_audited_and_changes_nothing_B28(
        api: Api) -> None:
    """B28: a viewer's pause, an operator's jump and an operator's breaker reset are 403,
    each audited with the caller; the task, the breaker and the vouchers stay as they were."""
    running = await recorded(api, "running")
    paused = await recorded(api, "paused")
    rt = api.runtime
    for _ in range(3):
        await rt.reader.breakers.record("c1", "offline", Outcome(task_id=str(uuid4()),
                                                                failed=True))
    calls: list[tuple[Role, str, dict[str, Any]]] = [
        ("viewer", f"/api/v1/tasks/{running.task_id}/pause", REASON),
        ("operator", f"/api/v1/tasks/{paused.task_id}/jump", REASON | {"step_index": 1}),
        ("operator", "/api/v1/breakers/reset", REASON | {"cluster": "c1", "kind": "offline"}),
    ]
    for role, path, body in calls:
        response = await api.post(path, body, role=role)
        assert response.status_code == 403, (role, path)
    entries = await api.audit()
    assert [(e.actor, e.action, e.result, e.target) for e in entries] == [
        (USERS[role], "authorize", "403", path) for role, path, _ in calls]
    assert (await state_of(api, running), await state_of(api, paused)) == ("running",
                                                                           "paused")
    state, _ = await rt.reader.breakers.load("c1", "offline")
    assert state.status == "OPEN"
    assert await vouchers(api) == 0


# ---------------------------------------------------------------- B29 controls


ILLEGAL: list[tuple[Ending, str, dict[str, object], str]] = [
    ("running", "resume", {}, "not paused"),
    ("terminated", "retry", {}, "only a failed task can be retried; it is terminated"),
    ("succeeded", "terminate", {}, "already succeeded"),
    ("running", "jump", {"step_index": 1}, "pause first"),
    ("paused", "jump", {"step_index": 9}, "step 9 is out of range 0..3"),
]


async def test_an_illegal_control_is_409_audited_and_changes_nothing_B29(api: Api) -> None:
    """B29: a control the task's recorded state does not allow (resume a running task, retry
    a terminated one...) is 409 with the reason, audited as refused, and changes nothing."""
    for ending, action, body, why in ILLEGAL:
        task = await recorded(api, ending)
        before = await state_of(api, task)
        response = await api.post(f"/api/tasks/{task.task_id}/{action}", REASON | body,
                                  role="admin")
        assert response.status_code == 409, (ending, action)
        assert why in response.json()["detail"]
        entry = (await api.audit())[-1]
        assert (entry.action, entry.target, entry.result.startswith("409 refused")) == (
            action, f"task/{task.task_id}", True)
        assert await state_of(api, task) == before
    assert await vouchers(api) == 0


UNREASONED: list[dict[str, object]] = [
    {}, {"reason": ""}, {"reason": " \t "}, {"reason": "x" * 501}, {"reason": None},
    {"reason": ["why"]}, {"reason": "ok", "task_ids": [str(uuid4())]}]


async def test_a_control_without_a_proper_reason_is_422_audited_and_changes_nothing_B29(
        api: Api) -> None:
    """B29: every mutating call says why in 1-500 characters, not only blanks, and nothing
    else: otherwise 422, audited as an invalid request, and nothing changes."""
    task = await recorded(api, "running")
    for body in UNREASONED:
        response = await api.post(f"/api/tasks/{task.task_id}/terminate", body)
        assert response.status_code == 422, body
    entries = await api.audit()
    assert [(e.action, e.result) for e in entries] == [("invalid_request", "422")] * len(
        UNREASONED)
    assert await state_of(api, task) == "running"
    assert await vouchers(api) == 0


async def test_a_bulk_of_10k_task_ids_is_413_before_it_is_read_B29(api: Api) -> None:
    """B29: the API has no bulk route; 10,000 task ids in a control's body pass the 256 KiB
    limit and are refused by the door, before any route reads them."""
    task = await recorded(api, "running")
    body = REASON | {"task_ids": [str(uuid4()) for _ in range(10_000)]}
    response = await api.post(f"/api/tasks/{task.task_id}/terminate", body)
    assert response.status_code == 413
    assert await state_of(api, task) == "running"
    assert await vouchers(api) == 0


# ---------------------------------------------------------------- B24, B26 at the API


async def test_an_injected_identifier_is_refused_B24(api: Api) -> None:
    """B24: identifiers in a path or a body must match the contract's pattern; a shell
    fragment, a path or a newline is 422 (or, where it splits the path so that no route
    takes it, 404 or 405)."""
    for identifier in ("j1; rm -rf /", "..%2F..%2Fetc", "j1%0Areboot", "$(reboot)"):
        literal = identifier.replace("%2F", "/").replace("%0A", "\n")
        ml = await api.post("/api/ml/tasks", {"task_type": literal, "input": [0.0] * 64})
        assert ml.status_code == 422, identifier
        rotation = await api.post(f"/api/nodes/{identifier}/rotation/start",
                                  REASON | {"cluster": "c1"})
        assert rotation.status_code in (404, 405, 422), identifier
        shown = await api.get(f"/api/templates/{identifier}")
        assert shown.status_code in (404, 405, 422), identifier
    assert not [e for e in await api.audit() if e.result in ("accepted", "published")]


OUT_OF_BOUNDS: list[tuple[str, str, str]] = [
    ('args: {pool: "{pool}"}', 'args: {pool: "{pool}", nodes: 1000000000}',
     "steps.1.args.nodes"),
    ("jobs_per_run: 1", "jobs_per_run: 1000000000", "steps.0.args.max_jobs"),
    ("action: migrate_jobs", "action: exec_shell", "steps.0.action"),
]


async def test_a_template_with_parameters_out_of_bounds_is_422_and_not_saved_B26(
        api: Api) -> None:
    """B26: a template whose step would ask for 10^9 nodes or jobs, or an action outside the
    allowed ones (B23), is refused naming the field, at validation and at save; the active
    version stays."""
    _, before = await load_active(api.runtime.store)
    for old, new, field in OUT_OF_BOUNDS:
        assert old in BUILT_IN
        text = BUILT_IN.replace(old, new)
        checked = await api.post("/api/templates/validate", {"yaml": text})
        assert checked.status_code == 422, field
        assert field in problems(checked.json())
        saved = await api.put("/api/templates/load_balance", REASON | {"yaml": text})
        assert saved.status_code == 422, field
        assert field in problems(saved.json())
    _, after = await load_active(api.runtime.store)
    assert after == before

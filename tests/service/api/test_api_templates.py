"""Templates: shown from the task store, validated with the templater's rules (422 naming the
field), saved by admins only after validation as the next version, every save audited;
history, diffs, rollbacks (admin) and pins (operator)."""

from __future__ import annotations

import pytest

from services.store.template_versions import load_active
from tests.service.api.conftest import USERS, Api, auth
from tests.unit.api.test_api_templates import BUILT_IN

RAISED = BUILT_IN.replace("version: 1", "version: 2").replace("jobs_per_run: 1",
                                                                "jobs_per_run: 2")


async def versions(api: Api) -> dict[str, int]:
    _, active = await load_active(api.runtime.store)
    return active


def problems(response_json: dict[str, object]) -> dict[str, str]:
    """An invalid template's problems (a member of its problem details), field -> message."""
    assert response_json["type"] == "https://clusterwarden.dev/problems/invalid-template"
    found = response_json["problems"]
    assert isinstance(found, list)
    return {p["field"]: p["message"] for p in found}


async def test_templates_are_listed_and_shown(api: Api) -> None:
    listed = (await api.get("/api/templates")).json()
    assert {t["name"] for t in listed} == {"offline", "online", "load_balance", "scale_in",
                                           "scale_out", "restart_agent"}
    assert all(t["error"] is None for t in listed)
    shown = (await api.get("/api/templates/load_balance")).json()
    assert shown["yaml"] == BUILT_IN
    assert shown["template"]["steps"][0]["action"] == "migrate_jobs"
    assert (await api.get("/api/templates/nothing")).status_code == 404
    assert (await api.get("/api/templates/bad.name")).status_code == 422


async def test_a_valid_template_validates(api: Api) -> None:
    response = await api.post("/api/templates/validate", {"yaml": RAISED})
    assert response.status_code == 200
    assert response.json()["template"]["parameters"] == {"jobs_per_run": 2}


@pytest.mark.parametrize(("text", "field", "message"), [
    (BUILT_IN.replace("jobs_per_run: 1", "jobs_per_run: 0"), "steps.0.args.max_jobs",
     "greater than or equal to 1"),
    (BUILT_IN.replace("action: migrate_jobs", "action: migrate_all"), "steps.0.action",
     "unknown action 'migrate_all'"),
    (BUILT_IN.replace("priority: 5", "priority: 12"), "priority", "less than or equal to 9"),
    (BUILT_IN.replace('"{pool}", node_id', '"{poool}", node_id'), "steps.0.args.pool",
     "unknown placeholder {poool}"),
    (BUILT_IN.replace("need: load_balance", "need: scale_out")
     .replace("concurrent_with: [offline, online, scale_out, scale_in]", "concurrent_with: []"),
     "need", "a second template for need 'scale_out'"),
    ("name: [unclosed", "yaml", "not valid YAML"),
    ("base: &b {a: 1}\nname: *b\n", "yaml", "anchors and aliases are not allowed"),
])
async def test_an_invalid_template_is_422_naming_the_field(api: Api, text: str, field: str,
                                                           message: str) -> None:
    response = await api.post("/api/templates/validate", {"yaml": text})
    assert response.status_code == 422, response.text
    found = problems(response.json())
    assert field in found, found
    assert message in found[field]


async def test_an_admin_saves_a_template_and_the_save_is_audited(api: Api) -> None:
    response = await api.put("/api/templates/load_balance",
                             {"yaml": RAISED, "reason": "two jobs per run"})
    assert response.status_code == 200, response.text
    saved = response.json()
    assert saved["saved"] is True
    assert (saved["template"]["version"], saved["version"], saved["previous_version"]) == (
        2, 2, 1)
    # The active set still loads as the templater loads it.
    registry, _ = await load_active(api.runtime.store)
    assert registry["load_balance"].label == "load_balance.v2"
    assert (await api.get("/api/templates/load_balance")).json()["yaml"] == RAISED
    [entry] = [e for e in await api.audit() if e.action == "template_save"]
    assert (entry.actor, entry.action, entry.target, entry.reason, entry.result) == (
        USERS["admin"], "template_save", "template/load_balance", "two jobs per run",
        "saved load_balance.v2")
    assert entry.detail["sha256"] == saved["sha256"]
    assert entry.detail["previous_version"] == 1

    again = (await api.put("/api/templates/load_balance",
                           {"yaml": RAISED, "reason": "again"})).json()
    assert again["saved"] is False


async def test_the_version_is_the_stores_whatever_the_text_says(api: Api) -> None:
    # Tasks name their template name.vN: N is the store's count, not the editor's guess.
    edited = BUILT_IN.replace("jobs_per_run: 1", "jobs_per_run: 3")
    saved = (await api.put("/api/templates/load_balance",
                           {"yaml": edited, "reason": "three"})).json()
    assert saved["version"] == 2
    assert "version: 2" in (await api.get("/api/templates/load_balance")).json()["yaml"]


@pytest.mark.parametrize(("name", "text", "field"), [
    ("load_balance", RAISED.replace("jobs_per_run: 2", "jobs_per_run: 0"),
     "steps.0.args.max_jobs"),
    ("offline", RAISED, "name"),
])
async def test_an_invalid_save_changes_nothing_and_is_audited(
        api: Api, name: str, text: str, field: str) -> None:
    before = await versions(api)
    response = await api.put(f"/api/templates/{name}", {"yaml": text, "reason": "edit"})
    assert response.status_code == 422
    assert field in problems(response.json())
    assert await versions(api) == before
    [entry] = [e for e in await api.audit() if e.action == "template_save"]
    assert entry.result == "422 invalid"
    assert field in {p["field"] for p in entry.detail["problems"]}


async def test_a_save_needs_a_reason(api: Api) -> None:
    response = await api.put("/api/templates/load_balance", {"yaml": RAISED})
    assert response.status_code == 422


async def test_a_new_template_for_a_new_name_is_saved_beside_the_others(api: Api) -> None:
    # A second template for a need already served would break the folder: refused.
    copy = RAISED.replace("name: load_balance", "name: balance_two")
    response = await api.put("/api/templates/balance_two", {"yaml": copy, "reason": "try"})
    assert response.status_code == 422
    assert "a second template for need" in problems(response.json())["need"]
    assert "balance_two" not in await versions(api)


async def test_history_diff_rollback_and_pin(api: Api) -> None:
    await api.put("/api/templates/load_balance", {"yaml": RAISED, "reason": "two per run"})
    listed = {t["name"]: t for t in (await api.get("/api/templates")).json()}
    assert (listed["load_balance"]["version"], listed["load_balance"]["origin"]) == (2, "manual")

    history = (await api.get("/api/templates/load_balance/history")).json()
    assert [(v["version"], v["origin"], v["actor"]) for v in history["versions"]] == [
        (2, "manual", USERS["admin"]), (1, "builtin", "api")]
    diff = (await api.client.get("/api/templates/load_balance/diff", params={"from": 1, "to": 2},
                                 headers=auth("viewer"))).json()
    assert "-version: 1\n+version: 2\n" in diff["diff"]
    assert "+  jobs_per_run: 2\n" in diff["diff"]
    assert (await api.client.get("/api/templates/load_balance/diff",
                                 params={"from": 1, "to": 9},
                                 headers=auth("viewer"))).status_code == 404

    body = {"version": 1, "reason": "two was too many"}
    assert (await api.post("/api/templates/load_balance/rollback", body)).status_code == 403
    rolled = (await api.post("/api/templates/load_balance/rollback", body, role="admin")).json()
    assert (rolled["version"], rolled["origin"]) == (3, "rollback")
    assert (await versions(api))["load_balance"] == 3
    assert (await api.post("/api/templates/load_balance/rollback",
                           {"version": 7, "reason": "x"}, role="admin")).status_code == 404

    assert (await api.post("/api/templates/load_balance/pin", {"reason": "audit week"},
                           role="viewer")).status_code == 403
    pinned = (await api.post("/api/templates/load_balance/pin", {"reason": "audit week"})).json()
    assert (pinned["pinned"], pinned["pinned_by"], pinned["pin_reason"]) == (
        True, USERS["operator"], "audit week")
    listed = {t["name"]: t for t in (await api.get("/api/templates")).json()}
    assert listed["load_balance"]["pinned"] is True
    unpinned = (await api.post("/api/templates/load_balance/unpin", {"reason": "over"})).json()
    assert unpinned["pinned"] is False
    actions = [e.action for e in await api.audit() if e.target == "template/load_balance"]
    # Seeding the release is recorded in the versions, not audited: nobody chose it.
    assert actions == ["template_save", "template_rollback", "template_pin", "template_unpin"]

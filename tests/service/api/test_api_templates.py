"""Templates: shown from the folder, validated with the templater's rules (422 naming the
field), saved by admins only after validation, and every save audited."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.templater.templates import load_templates
from tests.service.api.conftest import USERS, Api
from tests.unit.api.test_api_templates import BUILT_IN

RAISED = BUILT_IN.replace("version: 1", "version: 2").replace("jobs_per_run: 1",
                                                                "jobs_per_run: 2")


def contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.glob("*.yaml")}


def problems(response_json: dict[str, object]) -> dict[str, str]:
    detail = response_json["detail"]
    assert isinstance(detail, dict)
    return {p["field"]: p["message"] for p in detail["problems"]}


async def test_templates_are_listed_and_shown(api: Api) -> None:
    listed = (await api.get("/api/templates")).json()
    assert {t["name"] for t in listed} == {"offline", "online", "load_balance", "scale_in",
                                           "scale_out"}
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


async def test_an_admin_saves_a_template_and_the_save_is_audited(api: Api,
                                                                 template_dir: Path) -> None:
    response = await api.put("/api/templates/load_balance",
                             {"yaml": RAISED, "reason": "two jobs per run"})
    assert response.status_code == 200, response.text
    saved = response.json()
    assert saved["saved"] is True
    assert saved["template"]["version"] == 2
    assert (template_dir / "load_balance.yaml").read_text() == RAISED
    # The folder still loads as the templater loads it.
    assert load_templates(template_dir)["load_balance"].label == "load_balance.v2"
    [entry] = await api.audit()
    assert (entry.actor, entry.action, entry.target, entry.reason, entry.result) == (
        USERS["admin"], "template_save", "template/load_balance", "two jobs per run",
        "saved load_balance.v2")
    assert entry.detail["sha256"] == saved["sha256"]
    assert entry.detail["previous_sha256"] == saved["previous_sha256"]

    again = (await api.put("/api/templates/load_balance",
                           {"yaml": RAISED, "reason": "again"})).json()
    assert again["saved"] is False


@pytest.mark.parametrize(("name", "text", "field"), [
    ("load_balance", BUILT_IN.replace("jobs_per_run: 1", "jobs_per_run: 2"), "version"),
    ("load_balance", RAISED.replace("jobs_per_run: 2", "jobs_per_run: 0"),
     "steps.0.args.max_jobs"),
    ("offline", RAISED, "name"),
])
async def test_an_invalid_save_changes_nothing_and_is_audited(
        api: Api, template_dir: Path, name: str, text: str, field: str) -> None:
    before = contents(template_dir)
    response = await api.put(f"/api/templates/{name}", {"yaml": text, "reason": "edit"})
    assert response.status_code == 422
    assert field in problems(response.json())
    assert contents(template_dir) == before
    [entry] = await api.audit()
    assert entry.result == "422 invalid"
    assert field in {p["field"] for p in entry.detail["problems"]}


async def test_a_save_needs_a_reason(api: Api) -> None:
    response = await api.put("/api/templates/load_balance", {"yaml": RAISED})
    assert response.status_code == 422


async def test_a_new_template_for_a_new_name_is_saved_beside_the_others(
        api: Api, template_dir: Path) -> None:
    # A second template for a need already served would break the folder: refused.
    copy = RAISED.replace("name: load_balance", "name: balance_two")
    response = await api.put("/api/templates/balance_two", {"yaml": copy, "reason": "try"})
    assert response.status_code == 422
    assert "a second template for need" in problems(response.json())["need"]
    assert not (template_dir / "balance_two.yaml").exists()

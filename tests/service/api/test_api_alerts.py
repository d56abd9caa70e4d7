"""Alerts through the API: listed firing first with filters, acknowledged by an operator
(audited, and left for the alerts service to tell Alertmanager), refused to a viewer, 404 for
an alert that does not exist. The alerts are recorded in the store as the alerts service
records them."""

from __future__ import annotations

from typing import Any

from services.alerts.records import list_alerts
from services.store.views import AlertRow
from tests.service.api.alert_stories import BREAKER, RESOLVED, SHORT_CIRCUIT, record, story
from tests.service.api.conftest import USERS, Api

REASON = "looking at node-7's NFS mount"


def keys(page: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["cluster_id"], a["dedup_key"]) for a in page["items"]]


async def stored(api: Api) -> dict[tuple[str, str], AlertRow]:
    async with api.runtime.store.session() as session:
        rows, _ = await list_alerts(session, None, None, 500, 0)
    return {(row.cluster_id, row.dedup_key): row for row in rows}


async def test_alerts_are_listed_firing_first_and_filtered(api: Api) -> None:
    await record(api.runtime.store, story())
    response = await api.get("/api/alerts")
    assert response.status_code == 200, response.text
    page = response.json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 50, 0)
    # Firing first, the most recently changed first among them.
    assert keys(page) == [BREAKER, SHORT_CIRCUIT, RESOLVED]
    breaker, short_circuit, resolved = page["items"]
    assert (breaker["status"], breaker["severity"], breaker["kind"], breaker["occurrences"]) == (
        "firing", "critical", "breaker_open", 2)
    assert breaker["message"] == "4 failed offline adjustments in the window"
    assert (breaker["resolution"], breaker["acknowledged_by"]) == (None, None)
    assert short_circuit["severity"] == "warning"
    assert (resolved["status"], resolved["kind"]) == ("resolved", "breaker_open")
    assert resolved["resolution"] == "breaker c2/migrate reset by ada: NFS fixed"
    assert resolved["resolved_at"] is not None

    firing = (await api.get("/api/alerts", status="firing")).json()
    assert (keys(firing), firing["total"]) == ([BREAKER, SHORT_CIRCUIT], 2)
    assert keys((await api.get("/api/alerts", status="resolved")).json()) == [RESOLVED]
    assert keys((await api.get("/api/alerts", cluster="c2")).json()) == [RESOLVED]
    assert keys((await api.get("/api/alerts", status="resolved", cluster="c1")).json()) == []
    second = (await api.get("/api/alerts", limit=1, offset=1)).json()
    assert (keys(second), second["total"]) == ([SHORT_CIRCUIT], 3)


async def test_bad_filters_are_422_and_reading_needs_a_token(api: Api) -> None:
    assert (await api.get("/api/alerts", status="open")).status_code == 422
    assert (await api.get("/api/alerts", cluster="c 1")).status_code == 422
    assert (await api.get("/api/alerts", limit=0)).status_code == 422
    assert (await api.get("/api/alerts", role=None)).status_code == 401


async def test_an_operator_acknowledges_an_alert_audited(api: Api) -> None:
    await record(api.runtime.store, story())
    cluster, key = BREAKER
    response = await api.post(f"/api/alerts/{cluster}/{key}/ack", {"reason": REASON},
                              role="operator")
    assert response.status_code == 200, response.text
    acked = response.json()
    assert (acked["status"], acked["acknowledged_by"], acked["ack_reason"]) == (
        "firing", USERS["operator"], REASON)
    assert acked["acknowledged_at"] is not None

    row = (await stored(api))[BREAKER]
    assert (row.acknowledged_by, row.ack_reason, row.status) == (
        USERS["operator"], REASON, "firing")
    # Alertmanager and the webhooks have not been told yet: the alerts service will.
    assert row.delivered_at is None
    # The others are untouched.
    assert (await stored(api))[SHORT_CIRCUIT].acknowledged_by is None
    [entry] = await api.audit()
    assert (entry.actor, entry.role, entry.action, entry.target, entry.reason,
            entry.result) == (USERS["operator"], "operator", "alert_ack",
                              f"alert/{cluster}/{key}", REASON, "acknowledged")
    listed = (await api.get("/api/alerts", status="firing")).json()["items"][0]
    assert (listed["dedup_key"], listed["acknowledged_by"]) == (key, USERS["operator"])


async def test_a_viewer_may_not_acknowledge(api: Api) -> None:
    await record(api.runtime.store, story())
    cluster, key = BREAKER
    response = await api.post(f"/api/v1/alerts/{cluster}/{key}/ack", {"reason": REASON},
                              role="viewer")
    assert response.status_code == 403
    assert "operator" in response.json()["detail"]
    assert (await stored(api))[BREAKER].acknowledged_by is None
    # Refused before the route runs: audited as a refused authorisation of the path.
    assert [(e.actor, e.action, e.target, e.result) for e in await api.audit()] == [
        (USERS["viewer"], "authorize", f"/api/v1/alerts/{cluster}/{key}/ack", "403")]


async def test_acknowledging_an_unknown_alert_is_404_and_audited(api: Api) -> None:
    await record(api.runtime.store, story())
    response = await api.post("/api/alerts/c1/breaker.c1.ofline/ack", {"reason": REASON},
                              role="operator")
    assert response.status_code == 404
    assert response.json()["detail"] == "no alert breaker.c1.ofline on c1"
    # A known key on another cluster is another alert.
    _, key = RESOLVED
    assert (await api.post(f"/api/alerts/c1/{key}/ack", {"reason": REASON})).status_code == 404
    assert [(e.target, e.result) for e in await api.audit()] == [
        ("alert/c1/breaker.c1.ofline", "404 no such alert"),
        (f"alert/c1/{key}", "404 no such alert")]
    assert all(row.acknowledged_by is None for row in (await stored(api)).values())


async def test_an_acknowledgement_needs_a_reason(api: Api) -> None:
    await record(api.runtime.store, story())
    cluster, key = BREAKER
    for body in ({}, {"reason": ""}, {"reason": "x" * 501}):
        response = await api.post(f"/api/alerts/{cluster}/{key}/ack", body)
        assert response.status_code == 422, body
    assert (await stored(api))[BREAKER].acknowledged_by is None

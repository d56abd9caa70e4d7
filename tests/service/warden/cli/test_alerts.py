"""`warden alerts` against the real API (in process) and its store: the alerts listed firing
first, and one acknowledged (operator; audited under the token's user)."""

from __future__ import annotations

import json

from services.alerts.records import list_alerts
from services.store.queries import list_audit
from services.store.views import AlertRow, AuditRow
from tests.service.api.alert_stories import BREAKER, RESOLVED, SHORT_CIRCUIT, record, story
from tests.service.api.conftest import USERS
from tests.service.warden.cli.conftest import Cli

HEADER = ["STATUS", "SEVERITY", "CLUSTER", "KIND", "DEDUP", "KEY", "SINCE", "TIMES",
          "ACKNOWLEDGED", "MESSAGE", "RESOLUTION"]


def recorded(cli: Cli) -> tuple[dict[tuple[str, str], AlertRow], list[AuditRow]]:
    """The alerts in the store, and the API's audit log (oldest first)."""
    async def read() -> tuple[dict[tuple[str, str], AlertRow], list[AuditRow]]:
        async with cli.runtime.store.session() as session:
            rows, _ = await list_alerts(session, None, None, 500, 0)
            audit, _ = await list_audit(session, limit=500)
        return {(r.cluster_id, r.dedup_key): r for r in rows}, list(reversed(audit))

    found: tuple[dict[tuple[str, str], AlertRow], list[AuditRow]] = cli.server.call(read)
    return found


def test_alerts_list_prints_firing_first_and_filters(warden: Cli) -> None:
    assert warden.run("alerts", "list", role="viewer").output == "no alert matches\n"
    warden.server.call(record, warden.runtime.store, story())
    result = warden.run("alerts", "list")
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split() == HEADER
    assert [r.split()[:3] for r in rows] == [["firing", "critical", "c1"],
                                            ["firing", "warning", "c1"],
                                            ["resolved", "critical", "c2"]]
    assert BREAKER[1] in rows[0]
    assert "4 failed offline adjustments in the window" in rows[0]
    assert "breaker c2/migrate reset by ada: NFS fixed" in rows[2]

    def words(*args: str) -> list[list[str]]:
        return [line.split() for line in warden.run("alerts", "list", *args).output.splitlines()]

    every = [row.split() for row in rows]
    assert words("--status", "firing")[1:] == every[:2]
    assert words("--cluster", "c2")[1:] == every[2:]
    paged = warden.run("alerts", "list", "--limit", "1").output.splitlines()
    assert [paged[1].split(), paged[2]] == [every[0], "(1 of 3; --offset 1 for more)"]
    page = json.loads(warden.run("alerts", "list", "--status", "resolved", "--json").output)
    assert [(a["cluster_id"], a["dedup_key"]) for a in page["items"]] == [RESOLVED]


def test_alerts_list_refuses_an_unknown_status(warden: Cli) -> None:
    result = warden.run("alerts", "list", "--status", "open")
    assert result.exit_code == 2
    assert "one of firing, resolved" in result.output


def test_an_operator_acknowledges_an_alert(warden: Cli) -> None:
    warden.server.call(record, warden.runtime.store, story())
    cluster, key = BREAKER
    result = warden.run("alerts", "ack", cluster, key, "--reason", "on it: node-7's NFS",
                        role="operator")
    assert result.exit_code == 0, result.output
    assert result.output == (f"alert {cluster}/{key} (firing) acknowledged by "
                             f"{USERS['operator']}: on it: node-7's NFS\n")
    alerts, audit = recorded(warden)
    assert (alerts[BREAKER].acknowledged_by, alerts[BREAKER].ack_reason) == (
        USERS["operator"], "on it: node-7's NFS")
    assert alerts[SHORT_CIRCUIT].acknowledged_by is None
    assert [(a.actor, a.action, a.target, a.result) for a in audit] == [
        (USERS["operator"], "alert_ack", f"alert/{cluster}/{key}", "acknowledged")]
    listed = warden.run("alerts", "list", "--status", "firing").output.splitlines()
    assert f"{USERS['operator']}: on it: node-7's NFS" in listed[1]


def test_an_acknowledgement_the_api_refuses_exits_1(warden: Cli) -> None:
    warden.server.call(record, warden.runtime.store, story())
    cluster, key = BREAKER
    viewer = warden.run("alerts", "ack", cluster, key, "--reason", "mine", role="viewer")
    assert viewer.exit_code == 1
    assert "error (403): forbidden: this needs the operator role" in viewer.output
    unknown = warden.run("alerts", "ack", cluster, "breaker.c1.ofline", "--reason", "typo",
                         role="operator")
    assert unknown.exit_code == 1
    assert "error (404): no alert breaker.c1.ofline on c1" in unknown.output
    alerts, audit = recorded(warden)
    assert all(a.acknowledged_by is None for a in alerts.values())
    assert [(a.actor, a.result) for a in audit] == [
        (USERS["viewer"], "403"), (USERS["operator"], "404 no such alert")]


def test_an_acknowledgement_the_cli_refuses_never_reaches_the_api(warden: Cli) -> None:
    warden.server.call(record, warden.runtime.store, story())
    cluster, key = BREAKER
    for args in ([cluster, key], [cluster, key, "--reason", ""],
                 [cluster, "breaker c1", "--reason", "x"]):
        result = warden.run("alerts", "ack", *args, role="operator")
        assert result.exit_code == 2, (args, result.output)
    alerts, audit = recorded(warden)
    assert (alerts[BREAKER].acknowledged_by, audit) == (None, [])

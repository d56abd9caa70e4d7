"""`warden breaker list` on the real redis-server, and `warden breaker reset` through the real
API (in process): audited under the token's user, announced on the real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from uuid import uuid4

import pytest
from typer.testing import CliRunner

from schemas.events.v1 import Alert
from schemas.topics import Topic
from services.api.auth import Role
from services.api.settings import ApiSettings
from services.scheduler.breaker import BreakerState, Outcome
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog, AuditRecord, Verdict
from services.shared.redis_client import Keys, connect_redis
from services.store.queries import list_audit
from services.store.views import AuditRow
from tests.service.api.conftest import DEAD_KAFKA, USERS, read_events
from tests.service.warden.cli.conftest import Cli, cli_of
from warden.cli import app
from warden.cli.events import describe


def _open_breaker(redis_url: str, namespace: str, cluster: str, name: str) -> None:
    """Three failures in a row: the breaker opens."""

    async def run() -> None:
        redis = connect_redis(redis_url)
        try:
            store = BreakerStore(redis, Keys(namespace), SchedulerSettings().breaker_config)
            for _ in range(3):
                await store.record(cluster, name, Outcome(task_id=uuid4().hex, failed=True))
        finally:
            await redis.aclose()

    asyncio.run(run())


@pytest.fixture
def env(redis_url: str, namespace: str) -> Iterator[dict[str, str]]:
    """The CLI's environment: the test's own namespace, whose keys go afterwards."""
    yield {"REDIS_URL": redis_url, "WARDEN_NAMESPACE": namespace}

    async def clean() -> None:
        redis = connect_redis(redis_url)
        try:
            stale = [k async for k in redis.scan_iter(match=f"{Keys(namespace).prefix}*",
                                                          count=1000)]
            if stale:
                await redis.delete(*stale)
        finally:
            await redis.aclose()

    asyncio.run(clean())


def test_breaker_list_shows_each_breaker_state(
        redis_url: str, namespace: str, env: dict[str, str]) -> None:
    runner = CliRunner()
    empty = runner.invoke(app, ["breaker", "list"], env=env)
    assert "no breaker has recorded an outcome yet" in empty.output
    _open_breaker(redis_url, namespace, "c1", "offline")
    _open_breaker(redis_url, namespace, "c2", "migrate@node-4")
    result = runner.invoke(app, ["breaker", "list"], env=env)
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()
    assert first.split()[:4] == ["c1", "offline", "OPEN", "window"]
    assert "FFF" in first
    assert second.split()[:3] == ["c2", "migrate@node-4", "OPEN"]
    only = runner.invoke(app, ["breaker", "list", "--cluster", "c2"],
                         env=env)
    assert only.output.splitlines() == [second]

# ------------------------------------------------------------------ warden breaker reset


def open_breaker(cli: Cli, cluster: str, name: str) -> None:
    """Three failures in a row: the breaker opens."""
    store = cli.runtime.reader.breakers

    async def run() -> None:
        for _ in range(3):
            await store.record(cluster, name, Outcome(task_id=uuid4().hex, failed=True))

    cli.server.call(run)


@dataclass
class Recorded:
    """The breaker and the two audit logs of a reset: Redis's (the scheduler's) and the API's."""

    state: BreakerState
    redis_audit: list[AuditRecord]
    redis_verdict: Verdict
    api_audit: list[AuditRow]


def recorded(cli: Cli, cluster: str, name: str) -> Recorded:
    rt = cli.runtime

    async def read() -> Recorded:
        state, _ = await rt.reader.breakers.load(cluster, name)
        log = AuditLog(rt.redis, rt.keys)
        async with rt.store.session() as session:
            rows, _ = await list_audit(session, limit=500)
        return Recorded(state, await log.read(), await log.verify(), list(reversed(rows)))

    result: Recorded = cli.server.call(read)
    return result


@pytest.mark.usefixtures("kafka_bootstrap")
def test_breaker_reset_goes_through_the_api_audited_under_the_tokens_user(
        warden: Cli, api_settings: ApiSettings) -> None:
    open_breaker(warden, "c1", "offline")
    result = warden.run("breaker", "reset", "--cluster", "c1", "--kind", "offline",
                        "--reason", "node-7 repaired, drains work again", role="admin")
    assert result.exit_code == 0, result.output
    assert "breaker c1/offline: OPEN -> CLOSED; audit entry 1" in result.output

    after = recorded(warden, "c1", "offline")
    assert (after.state.status, after.state.window, after.state.openings) == ("CLOSED", (), 1)
    # The scheduler's audit stream, written with the reset in one atomic step...
    [record] = after.redis_audit
    entry = record.entry
    assert (entry.actor, entry.role, entry.action, entry.target, entry.reason,
            entry.result) == (USERS["admin"], "admin", "breaker_reset", "c1/offline",
                              "node-7 repaired, drains work again", "OPEN -> CLOSED")
    assert after.redis_verdict.ok
    # ... and the API's own log, under the same user.
    [row] = after.api_audit
    assert (row.actor, row.role, row.action, row.target, row.result) == (
        USERS["admin"], "admin", "breaker_reset", "breaker/c1/offline", "OPEN -> CLOSED")
    assert row.detail["redis_audit_seq"] == entry.seq

    [raw] = warden.server.call(read_events, api_settings.kafka_bootstrap_servers,
                               api_settings.namespace, Topic.OPS_ALERTS, 1)
    alert = Alert.model_validate_json(raw)
    # It resolves the breaker's open alert (the same dedup key).
    assert (alert.severity, alert.kind, alert.cluster_id, alert.dedup_key, alert.status) == (
        "info", "breaker_reset", "c1", "breaker.c1.kind.offline", "resolved")
    assert USERS["admin"] in alert.message
    assert "node-7 repaired" in alert.message
    assert "breaker_reset" in describe(Topic.OPS_ALERTS, raw)


@pytest.mark.usefixtures("kafka_bootstrap")
def test_breaker_reset_of_a_node_scoped_breaker(warden: Cli) -> None:
    open_breaker(warden, "c1", "offline@node-3")
    result = warden.run("breaker", "reset", "--cluster", "c1", "--kind", "offline", "--node",
                        "node-3", "--reason", "replaced the GPU", role="admin")
    assert result.exit_code == 0, result.output
    after = recorded(warden, "c1", "offline@node-3")
    assert after.state.status == "CLOSED"
    assert after.redis_audit[0].entry.target == "c1/offline@node-3"
    assert after.api_audit[0].target == "breaker/c1/offline@node-3"


def test_breaker_reset_of_a_cluster_scoped_breaker_lifts_its_hold(warden: Cli) -> None:
    open_breaker(warden, "c1", "scale_in@*")
    holding = warden.runtime.reader.breakers.holding
    assert warden.server.call(holding, "c1") == {"scale_in@*"}
    result = warden.run("breaker", "reset", "--cluster", "c1", "--kind", "scale_in", "--scope",
                        "cluster", "--reason", "the provider's API is back", role="admin")
    assert result.exit_code == 0, result.output
    after = recorded(warden, "c1", "scale_in@*")
    assert after.state.status == "CLOSED"
    assert after.api_audit[0].target == "breaker/c1/scale_in@*"
    # The reset and the hold's end are one write with the audit entry.
    assert warden.server.call(holding, "c1") == set()


@pytest.mark.parametrize("args", [
    pytest.param(["--reason", "fixed", "--actor", "alice"], id="no typed-in actor"),
    pytest.param([], id="no reason"),
    pytest.param(["--reason", ""], id="an empty reason"),
    pytest.param(["--reason", "fixed", "--node", "node 3"], id="a bad node"),
])
def test_a_reset_the_cli_refuses_never_reaches_the_api(warden: Cli, args: list[str]) -> None:
    open_breaker(warden, "c1", "offline")
    result = warden.run("breaker", "reset", "--cluster", "c1", "--kind", "offline", *args,
                        role="admin")
    assert result.exit_code == 2, result.output
    after = recorded(warden, "c1", "offline")
    assert (after.state.status, after.redis_audit, after.api_audit) == ("OPEN", [], [])


@pytest.mark.parametrize(("kind", "role", "error", "result"), [
    pytest.param("offline", "operator", "error (403): forbidden: this needs the admin role",
                 "403", id="not an admin"),
    pytest.param("ofline", "admin", "error (404): no breaker c1/ofline", "404 no such breaker",
                 id="an unknown breaker"),
])
def test_a_reset_the_api_refuses_changes_nothing_and_is_audited(
        warden: Cli, kind: str, role: Role, error: str, result: str) -> None:
    open_breaker(warden, "c1", "offline")
    refused = warden.run("breaker", "reset", "--cluster", "c1", "--kind", kind,
                         "--reason", "fixed", role=role)
    assert refused.exit_code == 1
    assert error in refused.output
    after = recorded(warden, "c1", "offline")
    assert (after.state.status, after.redis_audit) == ("OPEN", [])
    assert [(row.actor, row.result) for row in after.api_audit] == [(USERS[role], result)]


def test_a_reset_whose_alert_is_not_published_stands_and_exits_1(
        api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    without_kafka = api_settings.model_copy(update={"kafka_bootstrap_servers": DEAD_KAFKA,
                                                    "publish_timeout_s": 3.0})
    with cli_of(without_kafka, monkeypatch) as warden:
        open_breaker(warden, "c1", "offline")
        result = warden.run("breaker", "reset", "--cluster", "c1", "--kind", "offline",
                            "--reason", "fixed", role="admin")
        assert result.exit_code == 1
        assert "OPEN -> CLOSED" in result.output
        assert "the breaker_reset alert could not be published" in result.output
        after = recorded(warden, "c1", "offline")
        assert after.state.status == "CLOSED"
        assert [row.result for row in after.api_audit] == ["OPEN -> CLOSED"]

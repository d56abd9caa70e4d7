"""`warden breaker list|reset` on the real redis-server (alerts kept, not sent)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from uuid import uuid4

import pytest
from typer.testing import CliRunner

from schemas.events.v1 import Alert
from schemas.topics import Topic
from services.scheduler.breaker import BreakerState, Outcome
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog, AuditRecord, Verdict
from services.shared.redis_client import Keys, connect_redis
from services.shared.settings import ServiceSettings
from warden.cli import app, breaker
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


def _state_and_audit(redis_url: str, namespace: str, cluster: str,
                     name: str) -> tuple[BreakerState, list[AuditRecord], Verdict]:
    async def run() -> tuple[BreakerState, list[AuditRecord], Verdict]:
        redis = connect_redis(redis_url)
        try:
            keys = Keys(namespace)
            state, _ = await BreakerStore(redis, keys, SchedulerSettings().breaker_config).load(
                cluster, name)
            log = AuditLog(redis, keys)
            return state, await log.read(), await log.verify()
        finally:
            await redis.aclose()

    return asyncio.run(run())


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[Alert]:
    """Alerts the CLI publishes, kept here instead of sent to Kafka."""
    alerts: list[Alert] = []

    async def keep(settings: ServiceSettings, alert: Alert) -> None:
        alerts.append(alert)

    monkeypatch.setattr(breaker, "publish_alert", keep)
    return alerts


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


def test_breaker_reset_closes_the_breaker_audits_it_and_raises_an_info_alert(
        redis_url: str, namespace: str, env: dict[str, str], published: list[Alert]) -> None:
    _open_breaker(redis_url, namespace, "c1", "offline")
    result = CliRunner().invoke(app, [
        "breaker", "reset", "--cluster", "c1", "--kind", "offline", "--actor", "alice",
        "--reason", "node-7 repaired, drains work again"], env=env)
    assert result.exit_code == 0, result.output
    assert "breaker c1/offline: OPEN -> CLOSED" in result.output

    state, records, verdict = _state_and_audit(redis_url, namespace, "c1", "offline")
    assert (state.status, state.window, state.openings) == ("CLOSED", (), 1)
    (record,) = records
    entry = record.entry
    assert (entry.actor, entry.role, entry.action, entry.target, entry.reason, entry.result) == (
        "alice", "admin", "breaker_reset", "c1/offline", "node-7 repaired, drains work again",
        "OPEN -> CLOSED")
    assert verdict.ok

    (alert,) = published
    assert (alert.severity, alert.kind, alert.cluster_id, alert.dedup_key) == (
        "info", "breaker_reset", "c1", "breaker-reset.c1.offline.1")
    assert "alice" in alert.message
    assert "node-7 repaired" in alert.message
    assert "breaker_reset" in describe(Topic.OPS_ALERTS, alert.model_dump_json().encode())


def test_breaker_reset_of_a_node_scoped_breaker(
        redis_url: str, namespace: str, env: dict[str, str], published: list[Alert]) -> None:
    _open_breaker(redis_url, namespace, "c1", "offline@node-3")
    result = CliRunner().invoke(app, [
        "breaker", "reset", "--cluster", "c1", "--kind", "offline", "--node", "node-3",
        "--actor", "bob", "--reason", "replaced the GPU"], env=env)
    assert result.exit_code == 0, result.output
    state, records, _ = _state_and_audit(redis_url, namespace, "c1", "offline@node-3")
    assert state.status == "CLOSED"
    assert records[0].entry.target == "c1/offline@node-3"
    assert published[0].dedup_key == "breaker-reset.c1.offline.node-3.1"


@pytest.mark.parametrize("missing", ["--actor", "--reason"])
def test_breaker_reset_needs_an_actor_and_a_reason(
        redis_url: str, namespace: str, env: dict[str, str], published: list[Alert],
        missing: str) -> None:
    _open_breaker(redis_url, namespace, "c1", "offline")
    args = {"--cluster": "c1", "--kind": "offline", "--actor": "alice", "--reason": "fixed"}
    del args[missing]
    result = CliRunner().invoke(app, ["breaker", "reset", *(x for kv in args.items()
                                                             for x in kv)],
                            env=env)
    assert result.exit_code == 2
    state, records, _ = _state_and_audit(redis_url, namespace, "c1", "offline")
    assert (state.status, records, published) == ("OPEN", [], [])


@pytest.mark.parametrize(("option", "value"), [("--reason", ""), ("--actor", "al ice")])
def test_breaker_reset_refuses_an_empty_reason_or_a_bad_actor(
        redis_url: str, namespace: str, env: dict[str, str], published: list[Alert],
        option: str, value: str) -> None:
    _open_breaker(redis_url, namespace, "c1", "offline")
    args = {"--cluster": "c1", "--kind": "offline", "--actor": "alice", "--reason": "fixed"}
    args[option] = value
    result = CliRunner().invoke(app, ["breaker", "reset", *(x for kv in args.items()
                                                             for x in kv)],
                            env=env)
    assert result.exit_code == 2
    assert _state_and_audit(redis_url, namespace, "c1", "offline")[0].status == "OPEN"


def test_breaker_reset_of_an_unknown_breaker_changes_nothing(
        redis_url: str, namespace: str, env: dict[str, str], published: list[Alert]) -> None:
    _open_breaker(redis_url, namespace, "c1", "offline")
    result = CliRunner().invoke(app, [
        "breaker", "reset", "--cluster", "c1", "--kind", "ofline", "--actor", "alice",
        "--reason", "typo"], env=env)
    assert result.exit_code == 1
    assert "no breaker c1/ofline" in result.output
    state, records, _ = _state_and_audit(redis_url, namespace, "c1", "offline")
    assert (state.status, records, published) == ("OPEN", [], [])


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

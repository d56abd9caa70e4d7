"""`warden tasks|nodes|templates|breaker reset|api` against the real API (in process), its store
and Redis."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from schemas.events.v1 import Alert, TaskEvent
from schemas.topics import Topic
from services.api.app import create_api
from services.api.auth import Role
from services.api.client import ApiClient, ClientSettings
from services.api.deps import Runtime
from services.api.settings import ApiSettings
from services.scheduler.breaker import BreakerState, Outcome
from services.shared.audit import AuditLog, AuditRecord, Verdict
from services.shared.registry import register_nodes
from services.store.queries import list_audit
from services.store.recorder import Recorder
from services.store.views import AuditRow
from services.templater.templates import TEMPLATE_DIR
from tests.service.api.conftest import DEAD_KAFKA, TOKENS, USERS, clean_redis, read_events
from tests.unit.api.stories import START, history, offline_task
from warden.cli import app, common
from warden.cli.events import describe


class Server:
    """The API under uvicorn on a free port, in a thread with its own event loop."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="warning"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self.server.serve(),), daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(200):
            if self.server.started:
                return self
            deadline.wait(0.05)
        raise RuntimeError("the API did not start")

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def call(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Run a coroutine in the server's loop (where the store and Redis connections live)."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result(30)


@dataclass
class Cli:
    server: Server
    runtime: Runtime
    role: Role | None = "admin"
    runner: CliRunner = field(default_factory=CliRunner)

    def run(self, *args: str, role: Role | None = None) -> Result:
        if role is not None:
            self.role = role
        return self.runner.invoke(app, list(args))

    def record(self, events: list[TaskEvent]) -> None:
        async def record() -> None:
            recorder = Recorder(self.runtime.store)
            for event in events:
                await recorder.record(event)

        self.server.call(record)


@contextmanager
def cli_of(settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """The CLI, its API client pointed at a real API served with `settings`."""
    api = create_api(settings)
    with Server(api) as server:
        running = Cli(server, api.state.runtime)

        def client() -> ApiClient:
            token = TOKENS[running.role] if running.role else ""
            return ApiClient(ClientSettings(url=server.url, token=SecretStr(token)))

        monkeypatch.setattr(common, "api_client", client)
        yield running
        server.call(clean_redis, running.runtime)


@pytest.fixture
def warden(api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    with cli_of(api_settings, monkeypatch) as running:
        yield running


def test_tasks_list_prints_a_table_and_json(warden: Cli) -> None:
    running = offline_task("node-001")
    failed = offline_task("node-002", start=START + timedelta(minutes=1))
    warden.record(history(running, "running") + history(failed, "failed"))
    result = warden.run("tasks", "list", role="viewer")
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split() == ["TASK", "STATE", "KIND", "TARGET", "STEP", "TEMPLATE",
                              "UPDATED", "REASON"]
    assert str(failed.task_id) in rows[0]
    assert "failed" in rows[0]
    assert "2/4" in rows[0]
    result = warden.run("tasks", "list", "--state", "running", "--json")
    page = json.loads(result.output)
    assert [t["task_id"] for t in page["items"]] == [str(running.task_id)]


def test_tasks_show_prints_evidence_steps_and_transitions(warden: Cli) -> None:
    task = offline_task("node-002")
    warden.record(history(task, "failed"))
    result = warden.run("tasks", "show", str(task.task_id), role="viewer")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "state     failed  step offline failed: not_drained" in out
    assert "node_fault_count=1.0 outside [0.0, 0.0] xid 79 on gpu 0: replace" in out
    assert "drain" in out
    assert "offline failed: not_drained" in out
    assert json.loads(warden.run("tasks", "show", str(task.task_id), "--json").output)[
        "task_id"] == str(task.task_id)


@pytest.mark.usefixtures("kafka_bootstrap")
def test_a_pause_is_accepted_and_followed_until_paused(warden: Cli) -> None:
    task = offline_task()
    warden.record(history(task, "running"))
    paused = [e for e in history(task, "paused") if e.state == "paused"]
    # The executor's answer, recorded while the command waits for it.
    later = threading.Timer(1.0, warden.record, args=(
        [p.model_copy(update={"task_id": task.task_id}) for p in paused],))
    later.start()
    try:
        result = warden.run("tasks", "pause", str(task.task_id), "--reason", "look first",
                            "--wait", "--timeout", "20", role="operator")
    finally:
        later.join()
    assert result.exit_code == 0, result.output
    assert f"pause of task {task.task_id} accepted" in result.output
    assert "expect paused" in result.output
    assert "paused step 2  alice: pause: look first" in result.output


def test_an_illegal_control_exits_1_with_the_reason(warden: Cli) -> None:
    task = offline_task()
    warden.record(history(task, "running"))
    result = warden.run("tasks", "resume", str(task.task_id), "--reason", "go", role="operator")
    assert result.exit_code == 1
    assert "error (409): cannot resume a task that is running" in result.output


def test_a_control_needs_a_reason_and_the_role(warden: Cli) -> None:
    task = offline_task()
    warden.record(history(task, "paused"))
    assert warden.run("tasks", "pause", str(task.task_id)).exit_code == 2
    assert warden.run("tasks", "pause", str(task.task_id), "--reason", "").exit_code == 2
    result = warden.run("tasks", "jump", str(task.task_id), "--step", "1", "--reason", "x",
                        role="operator")
    assert result.exit_code == 1
    assert "error (403): forbidden: this needs the admin role" in result.output


def test_without_a_token_the_cli_says_how_to_get_one(warden: Cli) -> None:
    warden.role = None
    result = warden.run("tasks", "list")
    assert result.exit_code == 1
    assert "WARDEN_API_TOKEN" in result.output


def test_nodes_prints_a_table(warden: Cli) -> None:
    rt = warden.runtime
    warden.server.call(register_nodes, rt.redis, rt.keys, "c1", ["node-001", "node-002"])
    result = warden.run("nodes", role="viewer")
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split()[:4] == ["CLUSTER", "NODE", "POOL", "STATE"]
    assert [r.split()[1] for r in rows] == ["node-001", "node-002"]
    assert all("enrolled" in r for r in rows)
    nodes = json.loads(warden.run("nodes", "--json").output)
    assert {n["node_id"] for n in nodes} == {"node-001", "node-002"}


def test_templates_list_show_validate_and_save(warden: Cli, tmp_path: Path) -> None:
    listed = warden.run("templates", "list", role="viewer")
    assert listed.exit_code == 0
    assert "load_balance" in listed.output
    shown = warden.run("templates", "show", "offline")
    assert "name: offline" in shown.output

    good = tmp_path / "load_balance.yaml"
    good.write_text((TEMPLATE_DIR / "load_balance.yaml").read_text()
                    .replace("version: 1", "version: 2"))
    result = warden.run("templates", "validate", str(good), role="operator")
    assert result.exit_code == 0, result.output
    assert "valid (load_balance.v2 for need load_balance, 2 steps)" in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("jobs_per_run: 1", "jobs_per_run: 0"))
    result = warden.run("templates", "validate", str(bad))
    assert result.exit_code == 1
    assert "steps.0.args.max_jobs: Input should be greater than or equal to 1" in result.output

    assert warden.run("templates", "save", str(good), "--reason", "v2",
                      role="operator").exit_code == 1
    result = warden.run("templates", "save", str(good), "--reason", "v2", role="admin")
    assert result.exit_code == 0, result.output
    assert "load_balance.yaml: saved" in result.output


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
    assert (alert.severity, alert.kind, alert.cluster_id, alert.dedup_key) == (
        "info", "breaker_reset", "c1", "breaker-reset.c1.offline.1")
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

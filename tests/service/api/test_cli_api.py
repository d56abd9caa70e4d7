"""`warden tasks|nodes|templates|api` against the real API (in process), its store and Redis."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from schemas.events.v1 import TaskEvent
from services.api.app import create_api
from services.api.auth import Role
from services.api.client import ApiClient, ClientSettings
from services.api.deps import Runtime
from services.api.settings import ApiSettings
from services.shared.registry import register_nodes
from services.store.recorder import Recorder
from services.templater.templates import TEMPLATE_DIR
from tests.service.api.conftest import TOKENS, clean_redis
from tests.unit.api.stories import START, history, offline_task
from warden.cli import app, common


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


@pytest.fixture
def warden(api_settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    app = create_api(api_settings)
    with Server(app) as server:
        running = Cli(server, app.state.runtime)

        def client() -> ApiClient:
            token = TOKENS[running.role] if running.role else ""
            return ApiClient(ClientSettings(url=server.url, token=SecretStr(token)))

        monkeypatch.setattr(common, "api_client", client)
        yield running
        server.call(clean_redis, running.runtime)


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

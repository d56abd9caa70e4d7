"""`warden tasks` against the real API (in process), its store and Redis."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from tests.service.warden.cli.conftest import Cli
from tests.unit.api.stories import START, history, offline_task


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


@pytest.mark.usefixtures("kafka_bootstrap")
def test_a_terminated_task_is_restarted(warden: Cli) -> None:
    task = offline_task()
    warden.record(history(task, "terminated"))
    result = warden.run("tasks", "restart", str(task.task_id), "--reason", "fixed the cable",
                        role="operator")
    assert result.exit_code == 0, result.output
    assert f"restart of task {task.task_id} accepted" in result.output
    assert "expect running; runs again from its first step under a new epoch" in result.output


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

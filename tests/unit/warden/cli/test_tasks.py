"""The task description `warden tasks show` prints (pure; the commands against the API are in
tests/service/warden/cli/test_tasks.py)."""

from __future__ import annotations

from typing import Any

from warden.cli import tasks


def test_describe_task_shows_initial_and_target_resources() -> None:
    step: dict[str, Any] = {
        "index": 0, "name": "add-capacity", "action": "add_capacity", "guard": None,
        "state": "completed", "attempts": 1, "command_id": None, "reason": "",
        "outputs": {"initial_nodes": 3, "initial_util_pct": 90.0, "target_nodes": 4,
                    "target_util_pct": 67.5}}
    text = tasks.describe_task({"task_id": "t", "state": "succeeded", "cluster_id": "c1",
                                "steps": [step]})
    assert "3 nodes at 90% -> 4 nodes at 67.5%" in text


def test_describe_task_shows_execution_counts_and_relations() -> None:
    steps: list[dict[str, Any]] = [
        {"index": i, "name": n, "action": a, "guard": None, "state": "pending", "attempts": 0,
         "command_id": None, "reason": "", "outputs": {}}
        for i, (n, a) in enumerate([("add-capacity", "add_capacity"), ("drain", "drain_node")])]
    text = tasks.describe_task({
        "task_id": "t", "state": "queued", "cluster_id": "c1", "steps": steps,
        "execution_count": None, "step_execution_counts": [None, 1],
        "relations": {"template": "scale_out", "concurrency": 4, "concurrent_with": ["offline"],
                      "exclusive_with": [{"template": "fw", "scope": "pool"}],
                      "depends_on": [{"template": "check", "scope": "target",
                                      "on_failure": "proceed"}]}})
    assert "executes  computed at run time" in text
    assert ("relations concurrency 4; exclusive_with fw (pool); depends_on check (target, "
            "on failure proceed); concurrent_with offline") in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert [row[3] for row in rows] == ["run", "1"]  # "run time", then one node

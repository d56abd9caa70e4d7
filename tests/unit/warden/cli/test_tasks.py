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

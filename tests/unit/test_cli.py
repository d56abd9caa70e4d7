"""The readable lines `warden events` and `warden demo` print for each watched event, and
`warden fleet fault` (pure; `warden breaker` on the real redis-server is in
tests/service/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from schemas.topics import Topic
from tests.contracts.examples import examples
from warden.cli import app
from warden.cli.events import WATCHED, describe, step_effect

GOLDEN_OF = {
    Topic.OPS_NODE_STATE: ("node_state", ["node-003", "suspect -> down", "no report"]),
    Topic.OPS_NEEDS: ("ops_need", ["offline", "node-002", "node_fault_count=1"]),
    Topic.OPS_TASK_EVENTS: ("task_event", ["running step 0 completed", "drain completed"]),
    Topic.OPS_ALERTS: ("alert", ["ALERT", "critical", "breaker_open"]),
}


@pytest.mark.parametrize("topic", WATCHED)
def test_every_watched_event_has_a_readable_line(topic: Topic) -> None:
    name, expected = GOLDEN_OF[topic]
    line = describe(topic, examples()[name].model_dump_json().encode())
    for part in expected:
        assert part in line


def test_a_step_that_moved_a_job_or_added_a_node_says_so() -> None:
    resumed = step_effect({"job_id": "node-002.train", "started": True, "resumed_step": 152})
    assert "job node-002.train runs again, from step 152" in resumed
    saved = step_effect({"job_id": "node-002.train", "checkpoint": "node-002.train",
                         "step": 150})
    assert "checkpointed at step 150" in saved
    added = step_effect({"added": 1, "added_nodes": "standby-1",
                         "reason": "3 nodes at 90% -> add 1 node"})
    assert "added standby-1: 3 nodes at 90% -> add 1 node" in added
    assert step_effect({"added": 0, "reason": "no standby capacity"}) == ""
    assert step_effect({"mode": "draining"}) == ""


# ------------------------------------------------------------------ warden fleet fault (models)


def test_fleet_fault_makes_a_model_flaky_or_a_node_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.faults import read_faults
    from agent.fleet import agent_dir

    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(app, ["fleet", "fault", "node-002", "--flaky-model",
                                 "digits-mlp@1", "--failure-rate", "0.5"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["fleet", "fault", "node-002", "--failing-node",
                                 "--slow-ms", "200"])
    assert result.exit_code == 0, result.output
    faults = read_faults(agent_dir(tmp_path, "node-002")).model_faults
    assert [(f.model, f.failure_rate, f.cause, f.latency_ms) for f in faults] == [
        (None, 1.0, "node_fault", 200.0), ("digits-mlp@1", 0.5, "model_fault", 0.0)]
    bad = runner.invoke(app, ["fleet", "up", "--models", "digits-gpt@9"])
    assert bad.exit_code == 2
    assert "unknown models" in bad.output

"""`warden fleet`: the faults `fleet fault` writes into an agent's fault plan, and the models
`fleet up` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from warden.cli import app


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

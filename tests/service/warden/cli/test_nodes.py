"""`warden nodes` against the real API (in process) and Redis."""

from __future__ import annotations

import json
from pathlib import Path

from common.reportauth import read_node_key
from services.shared.registry import register_nodes
from tests.service.warden.cli.conftest import Cli


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


def test_nodes_enroll_writes_the_key_the_agent_is_given(warden: Cli, tmp_path: Path) -> None:
    out = tmp_path / "node-009.report.key"
    result = warden.run("nodes", "enroll", "node-009", "--cluster", "c1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "enrolled c1/node-009" in result.output
    key = read_node_key(out)
    assert (key.cluster_id, key.node_id) == ("c1", "node-009")
    assert out.stat().st_mode & 0o077 == 0  # owner-only
    again = warden.run("nodes", "enroll", "node-009", "--cluster", "c1", "--out", str(out))
    assert "re-enrolled c1/node-009" in again.output
    assert read_node_key(out) == key
    # A viewer's token enrols nothing: the API's refusal ends the command.
    refused = warden.run("nodes", "enroll", "node-010", "--cluster", "c1", "--out",
                         str(tmp_path / "x"), role="viewer")
    assert refused.exit_code != 0
    assert not (tmp_path / "x").exists()

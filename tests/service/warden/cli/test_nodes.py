"""`warden nodes` against the real API (in process) and Redis."""

from __future__ import annotations

import json

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

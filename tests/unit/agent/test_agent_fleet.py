"""Fleet process handling with real `python -m agent` processes.

No broker is needed: the agents point at a closed loopback port, so they stay in startup
(waiting for Kafka) long enough to be listed, killed and stopped.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from agent.fleet import (
    agent_status,
    fleet_down,
    fleet_up,
    is_alive,
    kill_agent,
    log_path,
    node_name,
    pid_path,
    read_pid,
    start_agent,
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_log(path: Path, text: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}:\n{content}")


def test_node_names() -> None:
    assert [node_name(n) for n in (1, 2, 10, 123)] == [
        "node-001", "node-002", "node-010", "node-123"
    ]


def test_fleet_up_kill_and_down(tmp_path: Path, centre: object) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}",
    }
    keys = [centre.public_key]  # type: ignore[attr-defined]
    agents = fleet_up(2, 1, "local", "fleettest", tmp_path, env, keys, 0.5)
    try:
        assert [a.node_id for a in agents] == ["node-001", "node-002"]
        for process in agents:
            assert read_pid(tmp_path, process.node_id) == process.pid
            assert process.state_dir == tmp_path / "agents" / process.node_id
            assert process.log_path == log_path(tmp_path, process.node_id)
        # The agents really run, with their settings, and find no GPU driver here.
        for process in agents:
            log = wait_for_log(process.log_path, "GPU source")
            assert process.node_id in wait_for_log(process.log_path, "state in")
            assert "GPU source: SIMULATED (1 GPUs)" in log or "GPU source: NVML" in log
        assert agent_status(tmp_path) == {"node-001": True, "node-002": True}

        # Starting a node twice never makes a second agent with the same identity.
        again = start_agent(
            "node-001", gpus=1, cluster_id="local", namespace="fleettest", state_dir=tmp_path,
            env=env, trusted_keys=keys, interval_s=0.5,
        )
        assert again.pid == agents[0].pid

        assert kill_agent(tmp_path, "node-002")
        assert not is_alive(agents[1].pid)
        assert pid_path(tmp_path, "node-002").exists()  # a crash leaves its pid file
        assert agent_status(tmp_path) == {"node-001": True, "node-002": False}
        assert not kill_agent(tmp_path, "node-002")
    finally:
        stopped = fleet_down(tmp_path, timeout_s=15.0)
    assert stopped == ["node-001"]
    assert not is_alive(agents[0].pid)
    assert agent_status(tmp_path) == {}
    assert (tmp_path / "agents" / "node-001" / "journal.sqlite3").exists()


def test_stale_pid_file_is_not_signalled(tmp_path: Path) -> None:
    # A pid that is not an agent (here: this test process) is never treated as one.
    pid_path(tmp_path, "node-009").parent.mkdir(parents=True)
    pid_path(tmp_path, "node-009").write_text(f"{os.getpid()}\n")
    assert agent_status(tmp_path) == {"node-009": False}
    assert not kill_agent(tmp_path, "node-009")
    assert fleet_down(tmp_path) == []


@pytest.mark.parametrize("content", ["", "garbage"])
def test_unreadable_pid_file(tmp_path: Path, content: str) -> None:
    pid_path(tmp_path, "node-003").parent.mkdir(parents=True)
    pid_path(tmp_path, "node-003").write_text(content)
    assert read_pid(tmp_path, "node-003") is None
    assert agent_status(tmp_path) == {"node-003": False}

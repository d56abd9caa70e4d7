"""Fleet process handling with real `python -m agent` processes.

No broker is needed: the agents point at a closed loopback port, so they stay in startup
(waiting for Kafka) long enough to be listed, killed and stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.fleet import (
    REPO_ROOT,
    agent_dir,
    agent_env,
    agent_status,
    checkpoint_store,
    fleet_down,
    fleet_up,
    is_alive,
    job_pids,
    kill_agent,
    log_path,
    node_name,
    pid_path,
    read_pid,
    start_agent,
)
from agent.jobs.processes import PID_FILE as JOB_PID_FILE
from agent.jobs.processes import job_dir
from agent.ml.runtime import STATUS_FILE
from agent.peers import PROBE_FILE, PeerProber, read_probe_addr
from tests.ports import free_port
from tests.waiting import DEADLINE_S, wait_until


def wait_for_log(path: Path, text: str, timeout_s: float = DEADLINE_S) -> str:
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
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
    }
    keys = centre.public_keys  # type: ignore[attr-defined]
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

        # They answer their peers' probes before Kafka is reachable at all.
        for process in agents:
            wait_for_file(process.state_dir / PROBE_FILE)
        # (A live agent answers as soon as it can; the timeout only bounds a stuck one.)
        prober = PeerProber("node-001", tmp_path / "agents", timeout_s=DEADLINE_S)
        probes = asyncio.run(prober.probe_round())
        assert [(p.peer_node_id, p.reachable) for p in probes] == [("node-002", True)]

        # Starting a node twice never makes a second agent with the same identity.
        again = start_agent(
            "node-001", gpus=1, cluster_id="local", namespace="fleettest", state_dir=tmp_path,
            env=env, trusted_keys=keys, interval_s=0.5,
        )
        assert again.pid == agents[0].pid

        assert kill_agent(tmp_path, "node-002")
        wait_until(lambda: not is_alive(agents[1].pid), "the killed agent is gone")
        # A killed agent leaves its address behind, and no longer answers at it.
        assert read_probe_addr(agents[1].state_dir / PROBE_FILE) is not None
        probes = asyncio.run(prober.probe_round())
        assert [(p.peer_node_id, p.reachable) for p in probes] == [("node-002", False)]
        assert pid_path(tmp_path, "node-002").exists()  # a crash leaves its pid file
        assert agent_status(tmp_path) == {"node-001": True, "node-002": False}
        assert not kill_agent(tmp_path, "node-002")

        # One more node, as the capacity provider adds it: a standby agent with no jobs.
        standby = start_agent(
            "standby-1", gpus=4, cluster_id="local", namespace="fleettest",
            state_dir=tmp_path, env=env, trusted_keys=keys, interval_s=0.5, jobs="",
        )
        standby_log = wait_for_log(standby.log_path, "state in")
        assert "jobs ''" in standby_log
        assert f"checkpoint store {tmp_path.resolve() / 'checkpoints'}" in standby_log
        assert agent_status(tmp_path)["standby-1"]
    finally:
        stopped = fleet_down(tmp_path, timeout_s=15.0)
    assert stopped == ["node-001", "standby-1"]
    assert not is_alive(agents[0].pid)
    assert agent_status(tmp_path) == {}
    assert (tmp_path / "agents" / "node-001" / "journal.sqlite3").exists()


def wait_for_file(path: Path, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_agent_env_passes_the_job_and_probe_settings(tmp_path: Path) -> None:
    def env_for(env: dict[str, str], **extra: object) -> dict[str, str]:
        return agent_env(node_id="node-004", gpus=2, cluster_id="c", namespace="n",
                         state_dir=tmp_path, env=env, trusted_keys=[], interval_s=1.0,
                         **extra)  # type: ignore[arg-type]

    default = env_for({})
    assert default["AGENT_JOBS"] == "train,infer"  # a fleet runs real jobs by default
    assert "AGENT_PROBE_PORT" not in default
    assert default["AGENT_STATE_DIR"] == str(agent_dir(tmp_path, "node-004"))
    passed = env_for({"AGENT_JOBS": "", "AGENT_PEER_PROBES": "5", "AGENT_HUNG_AFTER_S": "9"})
    assert (passed["AGENT_JOBS"], passed["AGENT_PEER_PROBES"], passed["AGENT_HUNG_AFTER_S"]) == (
        "", "5", "9"
    )
    chosen = env_for({"AGENT_JOBS": ""}, jobs="sim", probe_port=7001)
    assert (chosen["AGENT_JOBS"], chosen["AGENT_PROBE_PORT"]) == ("sim", "7001")
    # A standby node: no jobs of its own, whatever the environment says.
    assert env_for({"AGENT_JOBS": "train"}, jobs="")["AGENT_JOBS"] == ""


def test_agents_of_a_fleet_share_one_checkpoint_store(tmp_path: Path) -> None:
    envs = [
        agent_env(node_id=node, gpus=2, cluster_id="c", namespace="n", state_dir=tmp_path,
                  env={}, trusted_keys=[], interval_s=1.0)
        for node in ("node-001", "standby-1")
    ]
    assert {env["AGENT_CHECKPOINT_STORE"] for env in envs} == {
        str(checkpoint_store(tmp_path))
    }
    assert checkpoint_store(tmp_path) == tmp_path.resolve() / "checkpoints"
    shared = agent_env(node_id="node-001", gpus=2, cluster_id="c", namespace="n",
                       state_dir=tmp_path, env={"AGENT_CHECKPOINT_STORE": "/mnt/ckpt"},
                       trusted_keys=[], interval_s=1.0)
    assert shared["AGENT_CHECKPOINT_STORE"] == "/mnt/ckpt"  # a shared mount, as configured


def test_leftover_jobs_are_reaped(tmp_path: Path) -> None:
    # A job whose agent is gone (here: started by the test), recorded where its agent keeps it.
    directory = job_dir(agent_dir(tmp_path, "node-001"), "node-001.train")
    job = subprocess.Popen(
        [sys.executable, "-m", "agent.ml.train", "--job-id", "node-001.train",
         "--job-dir", str(directory), "--nice", "0"],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # Its status file shows it runs (right after exec, its command line may still be blank).
        wait_for_file(directory / STATUS_FILE)
        (directory / JOB_PID_FILE).write_text(f"{job.pid}\n")
        assert job_pids(tmp_path, "node-001") == {"node-001.train": job.pid}
        os.kill(job.pid, signal.SIGSTOP)  # frozen by a hung_job fault: it cannot notice
        pid_path(tmp_path, "node-001").write_text(f"{os.getpid()}\n")  # not an agent
        assert fleet_down(tmp_path) == []
        assert job.wait(timeout=DEADLINE_S) is not None
        assert job_pids(tmp_path, "node-001") == {}
    finally:
        job.kill()
        job.wait()


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

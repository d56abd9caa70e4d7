"""Local fleet tooling: start, stop, kill and break agent processes on this machine.

Layout under a fleet's state directory:
    agents/<node>/agent.pid      the pid of the agent process
    agents/<node>/faults.json    its fault plan (see agent.faults)
    agents/<node>/journal.sqlite3
    agents/<node>/jobs.json      the jobs the node owns (see agent.jobs.table)
    agents/<node>/probe.addr     its peer-probe listener (see agent.peers)
    agents/<node>/launch.json    how it was started, so `restart_agent` can start it again
    agents/<node>/report.key     the node's report key, written as it starts (its enrolment)
    agents/<node>/jobs/<job>/    status.json, checkpoint.npz, job.pid, job.log of a job
    checkpoints/<job>/           checkpoint.npz, meta.json: the shared checkpoint store
                                 (AGENT_CHECKPOINT_STORE) migrations go through
    logs/agent-<node>.log
A plain library; the CLI, the capacity provider and the tests wrap it. `start_agent` starts
one agent for any node id: a standby node is one started with `jobs=""` (no jobs of its own,
only those migrated to it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.faults import FaultPlan, clear_fault_file, read_faults, write_faults
from agent.jobs.processes import JOBS_DIR
from agent.jobs.processes import PID_FILE as JOB_PID_FILE
from agent.settings import CHECKPOINTS_DIR
from common.reportauth import (
    NODE_KEY_FILE,
    configured_master,
    enrol_key,
    ensure_master,
    write_node_key,
)

log = logging.getLogger("clusterwarden.agent.fleet")

PID_FILE = "agent.pid"
LAUNCH_FILE = "launch.json"
# What a launch record keeps of an agent's environment: its own settings, not the machine's.
_LAUNCH_ENV_PREFIXES = ("AGENT_", "WARDEN_")
REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT_ARGV = ("-m", "agent")
JOB_MODULE_PREFIX = b"agent.ml."
# What a fleet agent runs unless told otherwise (AGENT_JOBS in the environment, or `jobs`).
FLEET_JOBS = "train,infer"

# Agents this process started: kept so they are reaped (and Popen never warns that a child
# it forgot is still running).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class AgentProcess:
    """One agent process of the local fleet."""

    node_id: str
    pid: int
    state_dir: Path
    log_path: Path


def node_name(number: int) -> str:
    """The id of the n-th node (1-based): node-001, node-002, ..."""
    return f"node-{number:03d}"


def agent_dir(state_dir: Path, node_id: str) -> Path:
    """The state directory of one agent of the fleet."""
    return state_dir / "agents" / node_id


def checkpoint_store(state_dir: Path) -> Path:
    """The checkpoint store every agent of the fleet shares."""
    return Path(state_dir).resolve() / CHECKPOINTS_DIR


def report_key_path(state_dir: Path, node_id: str) -> Path:
    return agent_dir(state_dir, node_id) / NODE_KEY_FILE


def centre_master(env: Mapping[str, str], state_dir: Path) -> Path:
    """The collector's report master of the stack `env` describes (its state dir's, unless
    configured): the one a local agent's report key must come from."""
    return configured_master(env, env.get("WARDEN_STATE_DIR") or state_dir)


def enrol_report_key(state_dir: Path, node_id: str, cluster_id: str, master: Path) -> Path:
    """Give a local node its report key, derived from the collector's master (made if the
    collector has not started yet: the first of the two makes it)."""
    key = enrol_key(ensure_master(master), cluster_id, node_id)
    return write_node_key(report_key_path(state_dir, node_id), key)


def log_path(state_dir: Path, node_id: str) -> Path:
    return state_dir / "logs" / f"agent-{node_id}.log"


def pid_path(state_dir: Path, node_id: str) -> Path:
    return agent_dir(state_dir, node_id) / PID_FILE


def fleet_nodes(state_dir: Path) -> list[str]:
    """Every node that has a pid file in this fleet."""
    root = state_dir / "agents"
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob(f"*/{PID_FILE}"))


# ---------------------------------------------------------------- processes


def _argv(pid: int) -> list[bytes] | None:
    """The command line of `pid`; None if there is no such process, [] if it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return None
    except OSError:
        return []


def _is_agent(pid: int) -> bool:
    """True if `pid` runs `python -m agent` (so a recycled pid is never signalled)."""
    argv = _argv(pid)
    if argv is None:
        return False
    if not argv:
        return True  # no /proc to check with: trust the pid file
    return any(
        argv[i : i + 2] == [part.encode() for part in AGENT_ARGV] for i in range(len(argv) - 1)
    )


def _is_job(pid: int) -> bool:
    """True if `pid` runs one of the agent's ML jobs (`python -m agent.ml.<job>`)."""
    argv = _argv(pid) or []
    return any(
        argv[i] == b"-m" and argv[i + 1].startswith(JOB_MODULE_PREFIX)
        for i in range(len(argv) - 1)
    )


def job_pids(state_dir: Path, node_id: str) -> dict[str, int]:
    """The running ML job processes recorded for a node, by job id."""
    pids: dict[str, int] = {}
    for path in sorted((agent_dir(state_dir, node_id) / JOBS_DIR).glob(f"*/{JOB_PID_FILE}")):
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_job(pid):
            pids[path.parent.name] = pid
    return pids


def _reap_jobs(state_dir: Path, node_id: str, timeout_s: float = 5.0) -> list[str]:
    """Stop the job processes an agent left behind (SIGCONT, SIGTERM, wait, SIGKILL)."""
    # A job notices a dead agent by itself, unless it was frozen (the hung_job fault);
    # this makes sure no job outlives its fleet.
    left = job_pids(state_dir, node_id)
    for pid in left.values():
        _signal(pid, signal.SIGCONT)
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid in left.values():
        while _is_job(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _is_job(pid):
            _signal(pid, signal.SIGKILL)
    return sorted(left)


def is_alive(pid: int) -> bool:
    """True if an agent process with this pid is running."""
    child = _children.get(pid)
    if child is not None:
        # Our own child: poll() is the truth, and it reaps a zombie (whose /proc entry would
        # no longer say "agent", leaving the child unreaped).
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    return _is_agent(pid)


def read_pid(state_dir: Path, node_id: str) -> int | None:
    """The pid recorded for a node, if any."""
    try:
        return int(pid_path(state_dir, node_id).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def agent_status(state_dir: Path) -> dict[str, bool]:
    """Each node of the fleet and whether its agent is running."""
    return {
        node: (pid := read_pid(state_dir, node)) is not None and is_alive(pid)
        for node in fleet_nodes(state_dir)
    }


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.05)
    return not is_alive(pid)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


# ---------------------------------------------------------------- starting and stopping


def agent_env(
    *,
    node_id: str,
    gpus: int,
    cluster_id: str,
    namespace: str,
    state_dir: Path,
    env: Mapping[str, str],
    trusted_keys: Sequence[Path],
    interval_s: float,
    pool: str = "default",
    jobs: str | None = None,
    probe_port: int | None = None,
    models: str | None = None,
) -> dict[str, str]:
    """The environment of one agent process (other AGENT_* settings pass through from `env`).

    `jobs` is AGENT_JOBS: None keeps env's (else "train,infer"), "" starts a standby agent
    with no jobs of its own. `models` is AGENT_MODELS (the ML models it serves): None keeps
    env's. Every agent of a fleet gets the same checkpoint store (env's
    AGENT_CHECKPOINT_STORE, else <state_dir>/checkpoints), so a job migrated out of one
    node resumes on any other.
    """
    child = dict(env)
    python_path = child.get("PYTHONPATH", "")
    child |= {
        "AGENT_JOBS": jobs if jobs is not None else child.get("AGENT_JOBS", FLEET_JOBS),
        # The agent runs from a checkout as well as from an installed distribution.
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{python_path}" if python_path else str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        "WARDEN_CLUSTER_ID": cluster_id,
        "WARDEN_NAMESPACE": namespace,
        "WARDEN_STATE_DIR": str(state_dir),
        "AGENT_NODE_ID": node_id,
        "AGENT_POOL": pool,
        "AGENT_GPUS": str(gpus),
        "AGENT_INTERVAL_S": str(interval_s),
        "AGENT_STATE_DIR": str(agent_dir(state_dir, node_id)),
        "AGENT_TRUSTED_KEYS": ",".join(str(Path(p).resolve()) for p in trusted_keys),
        "AGENT_REPORT_KEY_FILE": str(report_key_path(state_dir, node_id)),
        "AGENT_CHECKPOINT_STORE": (
            child.get("AGENT_CHECKPOINT_STORE") or str(checkpoint_store(state_dir))
        ),
    }
    if probe_port is not None:
        child["AGENT_PROBE_PORT"] = str(probe_port)
    if models is not None:
        child["AGENT_MODELS"] = models
    return child


def start_agent(
    node_id: str,
    *,
    gpus: int,
    cluster_id: str,
    namespace: str,
    state_dir: Path,
    env: Mapping[str, str],
    trusted_keys: Sequence[Path],
    interval_s: float,
    pool: str = "default",
    jobs: str | None = None,
    probe_port: int | None = None,
    models: str | None = None,
    report_master: Path | None = None,
) -> AgentProcess:
    """Start one agent process (or return the one already running for this node), enrolled
    with its report key from `report_master` (default: the collector's of `env`)."""
    home = agent_dir(state_dir, node_id)
    logs = log_path(state_dir, node_id)
    pid = read_pid(state_dir, node_id)
    if pid is not None and is_alive(pid):
        # Two agents with one node id would share a journal and a consumer group.
        log.info("agent %s already runs as pid %d", node_id, pid)
        return AgentProcess(node_id, pid, home, logs)
    home.mkdir(parents=True, exist_ok=True)
    logs.parent.mkdir(parents=True, exist_ok=True)
    master = (report_master or centre_master(env, state_dir)).resolve()
    enrol_report_key(state_dir, node_id, cluster_id, master)
    child_env = agent_env(
        node_id=node_id, gpus=gpus, cluster_id=cluster_id, namespace=namespace,
        state_dir=state_dir, env=env, trusted_keys=trusted_keys, interval_s=interval_s,
        pool=pool, jobs=jobs, probe_port=probe_port, models=models,
    )
    with logs.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, *AGENT_ARGV],
            env=child_env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal that started the fleet does not
            # kill the agents; fleet_down does.
            start_new_session=True,
        )
    _children[process.pid] = process
    _write_launch(home, {
        "gpus": gpus, "cluster_id": cluster_id, "namespace": namespace,
        "interval_s": interval_s, "pool": pool, "jobs": jobs, "probe_port": probe_port,
        "models": models, "trusted_keys": [str(Path(p).resolve()) for p in trusted_keys],
        "report_master": str(master),
        "env": {k: v for k, v in child_env.items() if k.startswith(_LAUNCH_ENV_PREFIXES)},
    })
    tmp = pid_path(state_dir, node_id).with_suffix(".tmp")
    tmp.write_text(f"{process.pid}\n")
    tmp.replace(pid_path(state_dir, node_id))
    log.info("started agent %s as pid %d (log %s)", node_id, process.pid, logs)
    return AgentProcess(node_id, process.pid, home, logs)


def _write_launch(home: Path, record: dict[str, Any]) -> None:
    """Keep how an agent was started (owner-only: it holds the agent's environment)."""
    tmp = home / f".{LAUNCH_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
    tmp.chmod(0o600)
    tmp.replace(home / LAUNCH_FILE)


def read_launch(state_dir: Path, node_id: str) -> dict[str, Any] | None:
    """The launch record of a node's agent; None if it was never started here."""
    try:
        record: dict[str, Any] = json.loads(
            (agent_dir(state_dir, node_id) / LAUNCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def restart_agent(state_dir: Path, node_id: str, env: Mapping[str, str],
                  timeout_s: float = 15.0) -> AgentProcess | None:
    """Start a node's agent again as it was started before; None if it never was here.

    An agent still running (hung: alive, but not reporting) is stopped first. `env` is the
    machine's environment (broker, paths); the agent's own settings come from its record.
    """
    record = read_launch(state_dir, node_id)
    if record is None:
        return None
    stop_agent(state_dir, node_id, timeout_s)
    return start_agent(
        node_id, gpus=int(record["gpus"]), cluster_id=str(record["cluster_id"]),
        namespace=str(record["namespace"]), state_dir=state_dir,
        env={**env, **record.get("env", {})},
        trusted_keys=[Path(p) for p in record.get("trusted_keys", [])],
        interval_s=float(record["interval_s"]), pool=str(record.get("pool", "default")),
        jobs=record.get("jobs"), probe_port=record.get("probe_port"),
        models=record.get("models"),
        report_master=Path(record["report_master"]) if record.get("report_master") else None,
    )


def fleet_up(
    nodes: int,
    gpus: int,
    cluster_id: str,
    namespace: str,
    state_dir: Path,
    env: Mapping[str, str],
    trusted_keys: Sequence[Path],
    interval_s: float,
    *,
    pool: str = "default",
    first: int = 1,
    jobs: str | None = None,
    models: str | None = None,
) -> list[AgentProcess]:
    """Start agents node-<first> .. node-<first+nodes-1>, each a `python -m agent` process."""
    # `jobs` (AGENT_JOBS) defaults to env's AGENT_JOBS, else "train,infer". A non-zero
    # AGENT_PROBE_PORT in env is the first agent's port; the others count up from it, since
    # agents on one machine cannot share a port.
    base_port = int(env.get("AGENT_PROBE_PORT", "0") or "0")
    return [
        start_agent(
            node_name(number), gpus=gpus, cluster_id=cluster_id, namespace=namespace,
            state_dir=state_dir, env=env, trusted_keys=trusted_keys, interval_s=interval_s,
            pool=pool, jobs=jobs, models=models,
            probe_port=base_port + number - first if base_port else None,
        )
        for number in range(first, first + nodes)
    ]


def stop_agent(state_dir: Path, node_id: str, timeout_s: float = 15.0) -> bool:
    """SIGTERM one agent, wait, then SIGKILL it; True if it was running."""
    pid = read_pid(state_dir, node_id)
    running = pid is not None and is_alive(pid)
    if pid is not None and running:
        _signal(pid, signal.SIGTERM)
        if not _wait_exit(pid, timeout_s):
            log.warning("agent %s (pid %d) ignored SIGTERM; killing it", node_id, pid)
            _signal(pid, signal.SIGKILL)
            _wait_exit(pid, 5.0)
    _reap_jobs(state_dir, node_id)
    pid_path(state_dir, node_id).unlink(missing_ok=True)
    return running


def fleet_down(state_dir: Path, timeout_s: float = 15.0) -> list[str]:
    """Stop every agent of the fleet (SIGTERM to all, wait, SIGKILL what remains)."""
    pids = {node: read_pid(state_dir, node) for node in fleet_nodes(state_dir)}
    running = {node: pid for node, pid in pids.items() if pid is not None and is_alive(pid)}
    # Signal all first, so the agents shut down in parallel rather than one by one.
    for pid in running.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for node, pid in running.items():
        if not _wait_exit(pid, max(0.0, deadline - time.monotonic())):
            log.warning("agent %s (pid %d) ignored SIGTERM; killing it", node, pid)
            _signal(pid, signal.SIGKILL)
            _wait_exit(pid, 5.0)
    for node in pids:
        _reap_jobs(state_dir, node)
        pid_path(state_dir, node).unlink(missing_ok=True)
    return sorted(running)


def kill_agent(state_dir: Path, node_id: str) -> bool:
    """SIGKILL one agent: a dead agent, as a crash leaves it (the pid file stays)."""
    pid = read_pid(state_dir, node_id)
    if pid is None or not is_alive(pid):
        return False
    _signal(pid, signal.SIGKILL)
    _wait_exit(pid, 5.0)
    # Its jobs see their agent gone and exit on their own; a frozen one must be thawed first.
    for job_pid in job_pids(state_dir, node_id).values():
        _signal(job_pid, signal.SIGCONT)
    return True


# ---------------------------------------------------------------- faults


def inject_fault(state_dir: Path, node_id: str, **fields: Any) -> FaultPlan:
    """Add faults to a node's plan (fields of FaultPlan); the agent picks them up next report."""
    home = agent_dir(state_dir, node_id)
    current = read_faults(home)
    plan = FaultPlan.model_validate(current.model_dump() | fields)
    write_faults(home, plan)
    return plan


def clear_faults(state_dir: Path, node_id: str) -> None:
    """Make a node healthy again."""
    clear_fault_file(agent_dir(state_dir, node_id))

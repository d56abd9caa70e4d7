"""The JobManager with real job processes: start, status, hung, mode changes, failure, stop."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.faults import FaultPlan
from agent.jobs import (
    PID_FILE,
    TABLE_FILE,
    JobManager,
    JobRecord,
    JobSpec,
    JobTable,
    JobView,
    gpu_for,
    job_dir,
    job_specs,
    wanted,
)
from agent.ml.runtime import CHECKPOINT_FILE, STATUS_FILE
from schemas.events.v1 import JobInfo, now_utc
from tests.waiting import DEADLINE_S, wait_until

FAST = ("--status-every", "0.1", "--step-sleep", "0.005", "--nice", "0")
TRAIN = JobSpec("node-001.train", "training", "agent.ml.train", (0,),
                (*FAST, "--checkpoint-every", "0.3"))
INFER = JobSpec("node-001.infer", "inference", "agent.ml.infer", (1,), FAST)
HUNG_AFTER_S = 30.0  # far longer than any test waits: a job is hung when the test says so


class Clock:
    """The manager's clock: time.monotonic, plus whatever the test skipped ahead."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped


def test_specs_follow_the_names() -> None:
    specs = job_specs("node-007", 2, ["train", "infer"], checkpoint_every_s=4.0)
    assert [(s.job_id, s.kind, s.module, s.gpu_indices) for s in specs] == [
        ("node-007.train", "training", "agent.ml.train", (0,)),
        ("node-007.infer", "inference", "agent.ml.infer", (1,)),
    ]
    assert specs[0].args == ("--checkpoint-every", "4.0")
    assert [s.gpu_indices for s in job_specs("n", 1, ["train", "infer"])] == [(0,), (0,)]
    assert [s.gpu_indices for s in job_specs("n", 0, ["infer"])] == [()]
    assert job_specs("n", 2, []) == []
    assert gpu_for(1, 8) == [1]


@pytest.mark.parametrize(
    ("kind", "mode", "runs"),
    [
        ("training", "active", True),
        ("inference", "active", True),
        ("training", "draining", True),  # running work may finish
        ("inference", "draining", False),  # no new requests
        ("training", "offline", False),
        ("inference", "offline", False),
    ],
)
def test_what_runs_in_which_mode(kind: str, mode: str, runs: bool) -> None:
    assert wanted(kind, mode) is runs  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def manager(tmp_path: Path, clock: Clock) -> Iterator[JobManager]:
    # close() waits up to stop_timeout_s for the clean stop (checkpoint, exit) before a kill.
    jobs = JobManager([TRAIN, INFER], tmp_path, hung_after_s=HUNG_AFTER_S,
                      stop_timeout_s=DEADLINE_S, clock=clock)
    yield jobs
    jobs.close()


def wait_for(
    manager: JobManager, check: Callable[[list[JobInfo]], bool], timeout_s: float = DEADLINE_S
) -> list[JobInfo]:
    deadline = time.monotonic() + timeout_s
    jobs = manager.snapshot(now_utc())
    while time.monotonic() < deadline:
        jobs = manager.snapshot(now_utc())
        if check(jobs):
            return jobs
        time.sleep(0.05)
    raise AssertionError(f"jobs never matched: {jobs}")


def states(jobs: list[JobInfo]) -> list[str]:
    return [job.state for job in jobs]


def status_of(tmp_path: Path, spec: JobSpec) -> dict[str, object]:
    path = job_dir(tmp_path, spec.job_id) / STATUS_FILE
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


def test_jobs_start_when_told_run_and_stop(manager: JobManager, tmp_path: Path) -> None:
    manager.reconcile("active", FaultPlan())
    assert states(manager.snapshot(now_utc())) == ["starting", "starting"]
    assert manager.pids() == {}  # nothing runs before start(): the first report goes first

    manager.start()
    pids = manager.pids()
    assert sorted(pids) == ["node-001.infer", "node-001.train"]
    for spec in (TRAIN, INFER):
        assert (job_dir(tmp_path, spec.job_id) / PID_FILE).read_text().strip() == str(
            pids[spec.job_id]
        )
    jobs = wait_for(manager, lambda j: states(j) == ["running", "running"]
                    and all(job.throughput > 0 for job in j))
    assert [(j.job_id, j.kind, j.gpu_indices) for j in jobs] == [
        ("node-001.train", "training", [0]), ("node-001.infer", "inference", [1])
    ]
    assert jobs[0].progress_pct > 0.0

    manager.close()
    assert manager.pids() == {}
    assert states(manager.snapshot(now_utc())) == ["stopped", "stopped"]
    assert status_of(tmp_path, TRAIN)["state"] == "stopped"
    assert (job_dir(tmp_path, TRAIN.job_id) / CHECKPOINT_FILE).exists()
    assert not (job_dir(tmp_path, TRAIN.job_id) / PID_FILE).exists()


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_hung_job_fault_freezes_a_real_job(manager: JobManager, clock: Clock) -> None:
    manager.start()
    wait_for(manager, lambda j: states(j) == ["running", "running"])
    pid = manager.pids()["node-001.train"]

    manager.reconcile("active", FaultPlan(hung_job=True))
    # Really frozen, not just reported so (signals are delivered a moment after kill()).
    wait_until(lambda: proc_state(pid) == "T", f"job pid {pid} stopped")
    # Not hung until no progress was seen for hung_after_s; the inference job is untouched.
    assert states(manager.snapshot(now_utc()))[0] != "hung"
    clock.skipped += HUNG_AFTER_S + 1.0  # no progress for longer than that, from now on
    # The inference job shows progress again at its next status; the frozen one never does.
    jobs = wait_for(manager, lambda j: states(j) == ["hung", "running"])
    assert jobs[0].throughput == 0.0

    manager.reconcile("active", FaultPlan())
    wait_until(lambda: proc_state(pid) != "T", f"job pid {pid} thawed")
    wait_for(manager, lambda j: states(j) == ["running", "running"])
    assert manager.pids()["node-001.train"] == pid  # the same process, thawed


def test_mode_stops_jobs_and_brings_them_back(manager: JobManager, tmp_path: Path) -> None:
    manager.start()
    wait_for(manager, lambda j: states(j) == ["running", "running"])
    first_train = manager.pids()["node-001.train"]

    manager.reconcile("offline", FaultPlan(hung_job=True))  # a frozen job is stopped too
    wait_for(manager, lambda j: states(j) == ["stopped", "stopped"])
    assert manager.pids() == {}
    stopped_at = status_of(tmp_path, TRAIN)["step"]

    manager.reconcile("draining", FaultPlan())
    assert sorted(manager.pids()) == ["node-001.train"]  # training finishes its work
    wait_for(manager, lambda j: states(j) == ["running", "stopped"])
    resumed = status_of(tmp_path, TRAIN)
    assert resumed["resumed_from_step"] == stopped_at  # from its checkpoint, not from zero
    assert manager.pids()["node-001.train"] != first_train

    manager.reconcile("active", FaultPlan())
    wait_for(manager, lambda j: states(j) == ["running", "running"])


def test_a_failed_job_is_not_restarted(tmp_path: Path) -> None:
    broken = JobSpec("node-001.broken", "training", "agent.ml.no_such_job")
    manager = JobManager([broken], tmp_path, hung_after_s=30.0)
    try:
        manager.start()
        pid = manager.pids()["node-001.broken"]
        wait_for(manager, lambda j: states(j) == ["failed"])
        for mode in ("active", "draining", "active"):
            manager.reconcile(mode, FaultPlan())
        assert states(manager.snapshot(now_utc())) == ["failed"]
        assert manager.pids() == {}
        assert "no_such_job" in (job_dir(tmp_path, broken.job_id) / "job.log").read_text()
        assert manager.jobs[0].process is not None
        assert manager.jobs[0].process.pid == pid  # the centre decides about restarts
    finally:
        manager.close()


def test_no_jobs(tmp_path: Path) -> None:
    manager = JobManager([], tmp_path)
    manager.start()
    manager.reconcile("offline", FaultPlan(hung_job=True))
    assert manager.snapshot(now_utc()) == []
    manager.close()


def test_a_job_that_cannot_start_is_failed_not_an_error(tmp_path: Path) -> None:
    manager = JobManager([TRAIN], tmp_path, python=str(tmp_path / "no-python"))
    manager.start()  # must not raise: the report loop calls it
    assert states(manager.snapshot(now_utc())) == ["failed"]
    manager.reconcile("active", FaultPlan())
    assert states(manager.snapshot(now_utc())) == ["failed"]
    manager.close()


def test_the_job_table_is_what_the_node_owns(tmp_path: Path) -> None:
    configured = [JobRecord("n.train", "training", (0,)), JobRecord("n.infer", "inference", (1,))]
    table = JobTable(tmp_path / TABLE_FILE, configured)
    assert list(table.records) == ["n.train", "n.infer"]
    table.remove("n.train")
    table.put(JobRecord("other.train", "training", (0,), 2048))

    again = JobTable(tmp_path / TABLE_FILE, configured)
    # Given up stays given up, whatever the configuration says; what came in stays.
    assert list(again.records) == ["n.infer", "other.train"]
    assert again.records["other.train"].memory_mib == 2048
    assert again.gone == ["n.train"]

    # Unreadable: the configuration is the best guess left (and the agent still starts).
    (tmp_path / TABLE_FILE).write_text("{broken")
    assert list(JobTable(tmp_path / TABLE_FILE, configured).records) == ["n.train", "n.infer"]
    assert list(JobTable(None, configured).records) == ["n.train", "n.infer"]


def test_jobs_started_by_command_run_with_the_program_of_their_kind(tmp_path: Path) -> None:
    manager = JobManager([TRAIN], tmp_path, args_by_kind={"inference": FAST})
    try:
        manager.add(JobRecord("j1", "inference", (1,)), step=0, progress_pct=0.0)
        assert [job.spec for job in manager.jobs] == [
            TRAIN, JobSpec("j1", "inference", "agent.ml.infer", (1,), FAST)
        ]
        assert [(v.job_id, v.state, v.busy) for v in manager.views()] == [
            ("node-001.train", "starting", False), ("j1", "starting", False)
        ]
        manager.hold("j1", grace_s=1.0)
        assert manager.view("j1") == JobView("j1", "inference", "stopped", 0, 0.0, (1,), 0,
                                             False, True)
        assert manager.settled("j1")
        manager.release("j1")
        assert manager.view("j1") is not None
        manager.forget("j1")
        assert manager.view("j1") is None
        assert manager.settled("j1")
    finally:
        manager.close()

"""The ML jobs of a node as real child processes (JobManager).

A JobManager starts each job of the node's job table as `python -m agent.ml.<module>`, reads
the status file the job writes every second, and turns it into JobInfo. It follows the
node's mode (offline stops every job, draining stops inference; both come back when the node
is active again) and the fault plan (`hung_job` freezes a job with SIGSTOP until the plan
clears), but it never restarts a job that ended or failed on its own: that is the centre's
decision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.faults import FaultPlan
from agent.jobs.runner import JobState, JobView, LocalCheckpoint, wanted
from agent.jobs.table import TABLE_FILE, JobKind, JobRecord, JobTable, configured_records
from agent.ml.runtime import CHECKPOINT_FILE, STATUS_FILE
from schemas.events.v1 import JobInfo, NodeMode

log = logging.getLogger("clusterwarden.agent.jobs")

JOBS_DIR = "jobs"
PID_FILE = "job.pid"
LOG_FILE = "job.log"
REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_THROUGHPUT = 1e9  # the schema's bound on JobInfo.throughput

# The program of a job start_job brings, by kind.
JOB_MODULES: dict[JobKind, str] = {"training": "agent.ml.train", "inference": "agent.ml.infer"}


def job_dir(state_dir: Path, job_id: str) -> Path:
    """Where a job keeps its status, checkpoint, pid and log."""
    return state_dir / JOBS_DIR / job_id


@dataclass(frozen=True)
class JobSpec:
    """One job the node runs."""

    job_id: str
    kind: JobKind
    module: str
    gpu_indices: tuple[int, ...] = ()
    args: tuple[str, ...] = ()
    memory_mib: int = 0

    @property
    def record(self) -> JobRecord:
        return JobRecord(self.job_id, self.kind, self.gpu_indices, self.memory_mib)


def job_specs(
    node_id: str, gpus: int, names: Sequence[str], *, checkpoint_every_s: float = 5.0
) -> list[JobSpec]:
    """The specs of the named jobs (names as in AGENT_JOBS: train, infer)."""
    args = job_args(checkpoint_every_s)
    return [
        JobSpec(r.job_id, r.kind, JOB_MODULES[r.kind], r.gpu_indices, args[r.kind])
        for r in configured_records(node_id, gpus, names)
    ]


def job_args(checkpoint_every_s: float = 5.0) -> dict[JobKind, tuple[str, ...]]:
    """The extra arguments of each kind of job."""
    return {"training": ("--checkpoint-every", str(checkpoint_every_s)), "inference": ()}


@dataclass
class ManagedJob:
    """A job and what the manager knows about its process."""

    spec: JobSpec
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    # True until the job is first started, and again after the mode stopped it: only then
    # may the manager start it (a job that ended or failed on its own stays down).
    may_start: bool = True
    stopping_since: float | None = None
    kill_at: float | None = None
    killed: bool = False
    frozen: bool = False
    spawn_failed: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    progress_mark: Any = None
    progress_at: float = 0.0
    # A long action (migration, stop, restart) owns the job: never start it.
    held: bool = False
    run_after_hold: bool = False
    # What the job had done before its current process reported (a resume starts there).
    baseline_step: int = 0
    baseline_progress: float = 0.0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _clamp(value: Any, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    if number != number:  # NaN
        return 0.0
    return min(high, max(0.0, number))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("unreadable job status %s: %s", path, err)
        return None
    return loaded if isinstance(loaded, dict) else None


class JobManager:
    """Runs a node's jobs as child processes and reports on them."""

    def __init__(
        self,
        specs: Sequence[JobSpec],
        state_dir: Path,
        *,
        hung_after_s: float = 30.0,
        stop_timeout_s: float = 5.0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        args_by_kind: Mapping[JobKind, Sequence[str]] | None = None,
        persist: bool = True,
    ) -> None:
        self.state_dir = state_dir
        self.configured = {spec.job_id: spec for spec in specs}
        self.args_by_kind = {
            kind: tuple(args) for kind, args in (args_by_kind or job_args()).items()
        }
        self.table = JobTable(state_dir / TABLE_FILE if persist else None,
                              [spec.record for spec in specs])
        self.hung_after_s = hung_after_s
        self.stop_timeout_s = stop_timeout_s
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.jobs = [self._managed(record) for record in self.table.records.values()]
        self.started = False
        self._mode: NodeMode = "active"
        self._plan = FaultPlan()

    def _spec(self, record: JobRecord) -> JobSpec:
        """How to run a record: as configured, else the program of its kind."""
        base = self.configured.get(record.job_id)
        module = base.module if base is not None else JOB_MODULES[record.kind]
        args = base.args if base is not None else self.args_by_kind.get(record.kind, ())
        return JobSpec(record.job_id, record.kind, module, record.gpu_indices, args,
                       record.memory_mib)

    def _managed(
        self, record: JobRecord, baseline: tuple[int, float] | None = None
    ) -> ManagedJob:
        job = ManagedJob(self._spec(record), job_dir(self.state_dir, record.job_id))
        if baseline is None:
            # A job coming back after a restart shows the progress it had, not 0 %, until
            # its new process reports.
            left = _read_json(job.directory / STATUS_FILE) or {}
            baseline = (_int(left.get("step")), _clamp(left.get("progress_pct"), 100.0))
        job.baseline_step, job.baseline_progress = baseline
        return job

    def _find(self, job_id: str) -> ManagedJob | None:
        return next((job for job in self.jobs if job.spec.job_id == job_id), None)

    # ------------------------------------------------------------ processes

    def _child_env(self) -> dict[str, str]:
        env = dict(self.env)
        path = env.get("PYTHONPATH", "")
        # The jobs run from a checkout as well as from an installed distribution.
        env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        # Tiny matrices: BLAS threads would only spin, on a machine the control plane shares.
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = "1"
        return env

    def _spawn(self, job: ManagedJob) -> None:
        spec = job.spec
        # A resumed process reports step 0 until it has loaded its checkpoint: until then
        # the job shows where its previous process stopped.
        job.baseline_step, job.baseline_progress = self._progress(job)
        try:
            job.directory.mkdir(parents=True, exist_ok=True)
            # A status left by an earlier process must not pass for this one's.
            (job.directory / STATUS_FILE).unlink(missing_ok=True)
        except OSError:
            log.exception("preparing job %s failed", spec.job_id)
            job.may_start, job.spawn_failed = False, True
            return
        argv = [self.python, "-m", spec.module, "--job-id", spec.job_id,
                "--job-dir", str(job.directory), *spec.args]
        if spec.kind == "training" and (job.directory / CHECKPOINT_FILE).exists():
            argv.append("--resume")
        job.may_start = False
        try:
            with (job.directory / LOG_FILE).open("ab") as out:
                job.process = subprocess.Popen(
                    argv, env=self._child_env(), cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT,
                )
        except OSError:
            # A job that cannot start is a failed job, not a reason to stop reporting.
            log.exception("starting job %s failed", spec.job_id)
            job.process, job.spawn_failed = None, True
            return
        job.spawn_failed = False
        try:
            tmp = job.directory / f".{PID_FILE}.tmp"
            tmp.write_text(f"{job.process.pid}\n")
            tmp.replace(job.directory / PID_FILE)
        except OSError:
            # Only the fleet's clean-up of orphans reads it; the job itself runs fine.
            log.exception("recording the pid of job %s failed", spec.job_id)
        job.stopping_since = job.kill_at = None
        job.killed = job.frozen = False
        job.status, job.progress_mark, job.progress_at = {}, None, self.clock()
        log.info("started job %s as pid %d%s", spec.job_id, job.process.pid,
                 " (resuming from its checkpoint)" if "--resume" in argv else "")

    def _signal(self, job: ManagedJob, sig: signal.Signals) -> None:
        if job.process is not None and job.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                job.process.send_signal(sig)

    def _ask_to_stop(self, job: ManagedJob, grace_s: float | None = None) -> None:
        if not job.alive:
            return
        kill_at = self.clock() + (self.stop_timeout_s if grace_s is None else grace_s)
        if job.stopping_since is not None:
            # Already asked (the mode stopped it): a migration may wait longer for it.
            job.kill_at = max(job.kill_at or kill_at, kill_at)
            return
        # A frozen process would hold SIGTERM until it is thawed.
        if job.frozen:
            self._signal(job, signal.SIGCONT)
            job.frozen = False
        self._signal(job, signal.SIGTERM)
        job.stopping_since, job.kill_at = self.clock(), kill_at
        log.info("stopping job %s (checkpoint, then exit)", job.spec.job_id)

    def _enforce_kill(self, job: ManagedJob, now: float) -> None:
        if (
            job.kill_at is not None
            and job.alive
            and not job.killed
            and now > job.kill_at
        ):
            log.warning("job %s ignored SIGTERM; killing it", job.spec.job_id)
            self._signal(job, signal.SIGKILL)
            job.killed = True

    # ------------------------------------------------------------ policy

    def start(self) -> None:
        """Start the jobs the current mode wants (from now on, reconcile keeps them so)."""
        self.started = True
        self.reconcile(self._mode, self._plan)

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None:
        """Bring the processes in line with the mode and the fault plan (never blocks)."""
        self._mode, self._plan = mode, plan
        if not self.started:
            return
        now = self.clock()
        for job in self.jobs:
            if job.held:
                pass  # a long action decides about this job
            elif wanted(job.spec.kind, mode):
                if job.may_start and not job.alive:
                    self._spawn(job)
            elif job.alive:
                self._ask_to_stop(job)
                job.may_start = True  # the mode stopped it, so the mode brings it back
            self._enforce_kill(job, now)
        self._apply_hang(plan.hung_job)

    def _apply_hang(self, hang: bool) -> None:
        live = [j for j in self.jobs if j.alive and j.stopping_since is None]
        if hang:
            if any(j.frozen for j in live):
                return
            # Freeze the training job if there is one: its progress is what a hang stops.
            target = next((j for j in live if j.spec.kind == "training"), None)
            target = target or (live[0] if live else None)
            if target is not None:
                self._signal(target, signal.SIGSTOP)
                target.frozen = True
                log.warning("fault plan: job %s frozen (SIGSTOP)", target.spec.job_id)
            return
        for job in self.jobs:
            if job.frozen:
                self._signal(job, signal.SIGCONT)
                job.frozen = False
                log.warning("fault plan cleared: job %s thawed (SIGCONT)", job.spec.job_id)

    # ------------------------------------------------------------ reading

    def _read_status(self, job: ManagedJob) -> None:
        status = _read_json(job.directory / STATUS_FILE)
        if status is None:
            return
        job.status = status
        mark = (status.get("pid"), status.get("step"))
        if mark != job.progress_mark:
            job.progress_mark, job.progress_at = mark, self.clock()

    def _state(self, job: ManagedJob) -> JobState:
        if job.process is None:
            if job.spawn_failed:
                return "failed"
            # Not started yet (the first report goes out first), or kept down by the mode.
            wants = wanted(job.spec.kind, self._mode) and not job.held
            return "starting" if wants else "stopped"
        returncode = job.process.poll()
        if returncode is not None:
            # Whatever ends after we asked it to stop has stopped; anything else failed.
            if returncode == 0 or job.stopping_since is not None:
                return "stopped"
            return "failed"
        if self.clock() - job.progress_at > self.hung_after_s:
            return "hung"
        reported = job.status.get("state")
        if job.stopping_since is not None or reported == "checkpointing":
            return "checkpointing" if job.spec.kind == "training" else "running"
        if reported in (None, "starting"):
            return "starting"
        return "running"

    def _progress(self, job: ManagedJob) -> tuple[int, float]:
        """(step, progress %) of a job: its process's, or where it stood before it started."""
        if job.status.get("state") in (None, "starting"):
            return job.baseline_step, job.baseline_progress
        return _int(job.status.get("step")), _clamp(job.status.get("progress_pct"), 100.0)

    def snapshot(self, now: datetime) -> list[JobInfo]:
        """Every job as it is now, read from its process and its status file."""
        infos = []
        for job in self.jobs:
            if job.process is not None:
                self._read_status(job)
            state = self._state(job)
            infos.append(
                JobInfo(
                    job_id=job.spec.job_id,
                    kind=job.spec.kind,
                    state=state,
                    progress_pct=self._progress(job)[1],
                    throughput=(
                        _clamp(job.status.get("throughput"), MAX_THROUGHPUT)
                        if state == "running"
                        else 0.0
                    ),
                    gpu_indices=list(job.spec.gpu_indices),
                )
            )
        return infos

    def pids(self) -> dict[str, int]:
        """The pid of every job process that is still running."""
        return {j.spec.job_id: j.process.pid for j in self.jobs if j.process and j.alive}

    # ------------------------------------------------------------ job actions

    def _view(self, job: ManagedJob) -> JobView:
        if job.process is not None:
            self._read_status(job)
        step, progress = self._progress(job)
        return JobView(
            job_id=job.spec.job_id, kind=job.spec.kind, state=self._state(job), step=step,
            progress_pct=progress, gpu_indices=job.spec.gpu_indices,
            memory_mib=job.spec.memory_mib, alive=job.alive, busy=job.held,
        )

    def views(self) -> list[JobView]:
        return [self._view(job) for job in self.jobs]

    def view(self, job_id: str) -> JobView | None:
        job = self._find(job_id)
        return None if job is None else self._view(job)

    def checkpoint_file(self, job_id: str) -> Path | None:
        return job_dir(self.state_dir, job_id) / CHECKPOINT_FILE

    def add(self, record: JobRecord, *, step: int, progress_pct: float) -> None:
        old = self._find(record.job_id)
        if old is not None and old.process is not None and old.alive:
            # The actions only replace a failed job; anything still running is stopped first.
            self._signal(old, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.process.wait(timeout=1.0)
        self.table.put(record)
        job = self._managed(record, (step, progress_pct))
        self.jobs = [j for j in self.jobs if j.spec.job_id != record.job_id] + [job]
        log.info("job %s (%s) is now owned here, from step %d", record.job_id, record.kind, step)
        self.reconcile(self._mode, self._plan)

    def hold(self, job_id: str, grace_s: float) -> None:
        job = self._find(job_id)
        if job is None:
            return
        if not job.held:
            job.held = True
            job.run_after_hold = job.alive or job.may_start
        self._ask_to_stop(job, grace_s)

    def settled(self, job_id: str) -> bool:
        job = self._find(job_id)
        if job is None:
            return True
        # The report loop may be waiting out an hour-long interval: the kill is enforced here.
        self._enforce_kill(job, self.clock())
        return not job.alive

    def release(self, job_id: str) -> None:
        job = self._find(job_id)
        if job is None or not job.held:
            return
        job.held = False
        job.may_start = job.may_start or job.run_after_hold
        self.reconcile(self._mode, self._plan)

    def local_checkpoint(self, job_id: str) -> LocalCheckpoint:
        job = self._find(job_id)
        directory = job_dir(self.state_dir, job_id) if job is None else job.directory
        if job is not None and job.process is not None:
            self._read_status(job)
        step, progress = self._progress(job) if job is not None else (0, 0.0)
        # Not started by this agent (it restarted since): the last status is on disk.
        status = (job.status if job is not None else {}) or (
            _read_json(directory / STATUS_FILE) or {}
        )
        path = directory / CHECKPOINT_FILE
        if not path.exists():
            return LocalCheckpoint(None, step, progress)
        # Imported here: numpy costs every agent process memory and start-up time, and only
        # an agent exporting a checkpoint needs it.
        from agent.ml.train import checkpoint_step

        try:
            step = checkpoint_step(path)
        except (OSError, ValueError) as err:
            # A checkpoint nobody can resume from moves as no checkpoint: a fresh start
            # beats a job that fails on its next node.
            log.error("job %s: unreadable checkpoint %s (%s)", job_id, path, err)
            return LocalCheckpoint(None, step, progress)
        # The checkpoint may be older than the last status (a killed job): its own step counts.
        total = _int(status.get("total_steps"))
        if total:
            progress = min(100.0, 100.0 * step / total)
        return LocalCheckpoint(path, step, progress)

    def forget(self, job_id: str) -> None:
        job = self._find(job_id)
        self.table.remove(job_id)
        if job is None:
            return
        if job.process is not None and job.alive:
            log.warning("job %s still runs as it is given up; killing it", job_id)
            self._signal(job, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.process.wait(timeout=1.0)
        (job.directory / PID_FILE).unlink(missing_ok=True)
        self.jobs.remove(job)
        log.info("job %s is no longer owned here", job_id)

    def resize(self, job_id: str, gpu_indices: tuple[int, ...], memory_mib: int) -> None:
        job = self._find(job_id)
        if job is None:
            return
        job.spec = dataclasses.replace(job.spec, gpu_indices=gpu_indices, memory_mib=memory_mib)
        self.table.put(job.spec.record)

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Stop every job: SIGTERM (each checkpoints), wait, then SIGKILL what remains."""
        self.started = False
        for job in self.jobs:
            if job.alive:
                if job.frozen:
                    self._signal(job, signal.SIGCONT)
                    job.frozen = False
                self._signal(job, signal.SIGTERM)
                job.stopping_since = job.stopping_since or self.clock()
        deadline = time.monotonic() + self.stop_timeout_s
        for job in self.jobs:
            if job.process is None:
                continue
            try:
                job.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("job %s ignored SIGTERM; killing it", job.spec.job_id)
                job.process.kill()
                job.process.wait()
            (job.directory / PID_FILE).unlink(missing_ok=True)

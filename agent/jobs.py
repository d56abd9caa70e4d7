"""The ML jobs of a node: real child processes (JobManager) or a cheap simulation.

A JobManager starts each configured job as `python -m agent.ml.<module>`, reads the status
file the job writes every second, and turns it into JobInfo. It follows the node's mode
(offline stops every job, draining stops inference; both come back when the node is active
again) and the fault plan (`hung_job` freezes a job with SIGSTOP until the plan clears), but
it never restarts a job that ended or failed on its own: that is the centre's decision.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from agent.faults import FaultPlan
from agent.ml.runtime import CHECKPOINT_FILE, STATUS_FILE
from schemas.events.v1 import JobInfo, NodeMode

log = logging.getLogger("clusterwarden.agent.jobs")

JobKind = Literal["training", "inference"]
JobState = Literal["starting", "running", "checkpointing", "stopped", "failed", "hung"]

JOBS_DIR = "jobs"
PID_FILE = "job.pid"
LOG_FILE = "job.log"
REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_THROUGHPUT = 1e9  # the schema's bound on JobInfo.throughput

# Job name (as in AGENT_JOBS) -> (kind, module, preferred GPU).
JOB_TYPES: dict[str, tuple[JobKind, str, int]] = {
    "train": ("training", "agent.ml.train", 0),
    "infer": ("inference", "agent.ml.infer", 1),
}


class JobSource(Protocol):
    """Where a report's jobs come from."""

    def start(self) -> None: ...

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None: ...

    def snapshot(self, now: datetime) -> list[JobInfo]: ...

    def close(self) -> None: ...


def wanted(kind: JobKind, mode: NodeMode) -> bool:
    """Whether a job of `kind` runs on a node in `mode`."""
    if mode == "offline":
        return False
    # Draining lets running work finish but takes no new requests, so serving stops.
    return mode == "active" or kind == "training"


def gpu_for(preferred: int, gpus: int) -> list[int]:
    """The GPU a job uses on a node with `gpus` GPUs (none without GPUs)."""
    return [] if gpus == 0 else [min(preferred, gpus - 1)]


def job_dir(state_dir: Path, job_id: str) -> Path:
    """Where a job keeps its status, checkpoint, pid and log."""
    return state_dir / JOBS_DIR / job_id


# ---------------------------------------------------------------- simulated

TRAINING_RUN_S = 600.0  # one simulated training run, 0 -> 100 %
INFERENCE_THROUGHPUT = 120.0  # requests per second while serving


class SimulatedJobs:
    """Jobs without processes, for large fleets: progress advances with time unless hung."""

    def __init__(self, node_id: str, gpus: int, started_at: datetime) -> None:
        self.training_id = f"{node_id}.train"[:128]
        self.inference_id = f"{node_id}.infer"[:128]
        self.gpus = gpus
        self.progress_pct = 0.0
        self.runs = 0
        self._last = started_at
        self._mode: NodeMode = "active"
        self._hung = False

    def start(self) -> None:
        """Nothing to start."""

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None:
        self._mode, self._hung = mode, plan.hung_job

    def snapshot(self, now: datetime) -> list[JobInfo]:
        return self.advance(now, self._mode, self._hung)

    def close(self) -> None:
        """Nothing to stop."""

    def advance(self, now: datetime, mode: NodeMode, hung: bool) -> list[JobInfo]:
        """The jobs at `now`; progress moves only while the training job runs."""
        elapsed = max(0.0, (now - self._last).total_seconds())
        self._last = now
        running = wanted("training", mode)
        if running and not hung:
            self.progress_pct += elapsed / TRAINING_RUN_S * 100.0
            if self.progress_pct >= 100.0:
                self.runs += 1
                self.progress_pct %= 100.0
        training_state: JobState = "stopped" if not running else ("hung" if hung else "running")
        jobs = [
            JobInfo(
                job_id=self.training_id,
                kind="training",
                state=training_state,
                progress_pct=round(self.progress_pct, 3),
                throughput=0.0 if training_state != "running" else 1.0,
                gpu_indices=gpu_for(0, self.gpus),
            )
        ]
        if wanted("inference", mode):
            jobs.append(
                JobInfo(
                    job_id=self.inference_id,
                    kind="inference",
                    state="running",
                    throughput=INFERENCE_THROUGHPUT,
                    gpu_indices=gpu_for(1, self.gpus),
                )
            )
        return jobs


# ---------------------------------------------------------------- real processes


@dataclass(frozen=True)
class JobSpec:
    """One job the node runs."""

    job_id: str
    kind: JobKind
    module: str
    gpu_indices: tuple[int, ...] = ()
    args: tuple[str, ...] = ()


def job_specs(
    node_id: str, gpus: int, names: Sequence[str], *, checkpoint_every_s: float = 5.0
) -> list[JobSpec]:
    """The specs of the named jobs (names as in AGENT_JOBS: train, infer)."""
    specs = []
    for name in names:
        kind, module, preferred = JOB_TYPES[name]
        args = ("--checkpoint-every", str(checkpoint_every_s)) if kind == "training" else ()
        specs.append(
            JobSpec(f"{node_id}.{name}"[:128], kind, module, tuple(gpu_for(preferred, gpus)), args)
        )
    return specs


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
    killed: bool = False
    frozen: bool = False
    spawn_failed: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    progress_mark: Any = None
    progress_at: float = 0.0

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
    ) -> None:
        self.jobs = [ManagedJob(spec, job_dir(state_dir, spec.job_id)) for spec in specs]
        self.hung_after_s = hung_after_s
        self.stop_timeout_s = stop_timeout_s
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.started = False
        self._mode: NodeMode = "active"
        self._plan = FaultPlan()

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
        job.stopping_since = None
        job.killed = job.frozen = False
        job.status, job.progress_mark, job.progress_at = {}, None, self.clock()
        log.info("started job %s as pid %d%s", spec.job_id, job.process.pid,
                 " (resuming from its checkpoint)" if "--resume" in argv else "")

    def _signal(self, job: ManagedJob, sig: signal.Signals) -> None:
        if job.process is not None and job.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                job.process.send_signal(sig)

    def _ask_to_stop(self, job: ManagedJob) -> None:
        if job.stopping_since is not None or not job.alive:
            return
        # A frozen process would hold SIGTERM until it is thawed.
        if job.frozen:
            self._signal(job, signal.SIGCONT)
            job.frozen = False
        self._signal(job, signal.SIGTERM)
        job.stopping_since = self.clock()
        log.info("stopping job %s (checkpoint, then exit)", job.spec.job_id)

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
            if wanted(job.spec.kind, mode):
                if job.may_start and not job.alive:
                    self._spawn(job)
            elif job.alive:
                self._ask_to_stop(job)
                job.may_start = True  # the mode stopped it, so the mode brings it back
            if (
                job.stopping_since is not None
                and job.alive
                and not job.killed
                and now - job.stopping_since > self.stop_timeout_s
            ):
                log.warning("job %s ignored SIGTERM; killing it", job.spec.job_id)
                self._signal(job, signal.SIGKILL)
                job.killed = True
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
        try:
            status = json.loads((job.directory / STATUS_FILE).read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            log.warning("unreadable status of job %s: %s", job.spec.job_id, err)
            return
        if not isinstance(status, dict):
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
            return "starting" if wanted(job.spec.kind, self._mode) else "stopped"
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
                    progress_pct=_clamp(job.status.get("progress_pct"), 100.0),
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

"""Jobs without processes, for large fleets: progress advances with time unless hung."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from agent.faults import FaultPlan
from agent.jobs.runner import JobState, JobView, LocalCheckpoint, wanted
from agent.jobs.table import TABLE_FILE, JobRecord, JobTable, configured_records
from schemas.events.v1 import JobInfo, NodeMode

TRAINING_RUN_S = 600.0  # one simulated training run, 0 -> 100 %
SIM_STEPS_PER_S = 10.0  # simulated training steps per second
SIM_STEPS_PER_RUN = TRAINING_RUN_S * SIM_STEPS_PER_S
INFERENCE_THROUGHPUT = 120.0  # requests per second while serving


@dataclass
class SimJob:
    """A simulated job: its record and how many steps it has done (training only)."""

    record: JobRecord
    steps: float = 0.0
    held: bool = False


class SimulatedJobs:
    """Jobs without processes, for large fleets: progress advances with time unless hung."""

    def __init__(
        self,
        node_id: str,
        gpus: int,
        started_at: datetime,
        *,
        names: Sequence[str] = ("train", "infer"),
        state_dir: Path | None = None,
    ) -> None:
        self.gpus = gpus
        self.table = JobTable(
            None if state_dir is None else state_dir / TABLE_FILE,
            configured_records(node_id, gpus, names),
        )
        self.jobs: dict[str, SimJob] = {
            job_id: SimJob(record) for job_id, record in self.table.records.items()
        }
        self._last = started_at
        self._mode: NodeMode = "active"
        self._hung = False

    @property
    def _first_training(self) -> SimJob | None:
        return next((j for j in self.jobs.values() if j.record.kind == "training"), None)

    @property
    def progress_pct(self) -> float:
        """The progress of the node's (first) training job in its current run."""
        job = self._first_training
        return 0.0 if job is None else job.steps % SIM_STEPS_PER_RUN / SIM_STEPS_PER_RUN * 100.0

    @property
    def runs(self) -> int:
        """How many full runs the (first) training job has completed."""
        job = self._first_training
        return 0 if job is None else int(job.steps // SIM_STEPS_PER_RUN)

    def start(self) -> None:
        """Nothing to start."""

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None:
        self._mode, self._hung = mode, plan.hung_job

    def snapshot(self, now: datetime) -> list[JobInfo]:
        return self.advance(now, self._mode, self._hung)

    def close(self) -> None:
        """Nothing to stop."""

    def _running(self, job: SimJob, mode: NodeMode) -> bool:
        return wanted(job.record.kind, mode) and not job.held

    def _state(self, job: SimJob, mode: NodeMode, hung_job: SimJob | None) -> JobState:
        if not self._running(job, mode):
            return "stopped"
        return "hung" if job is hung_job else "running"

    def _progress(self, job: SimJob) -> float:
        if job.record.kind != "training":
            return 0.0
        return job.steps % SIM_STEPS_PER_RUN / SIM_STEPS_PER_RUN * 100.0

    def advance(self, now: datetime, mode: NodeMode, hung: bool) -> list[JobInfo]:
        """The jobs at `now`; progress moves only while a training job runs."""
        elapsed = max(0.0, (now - self._last).total_seconds())
        self._last = now
        self._mode = mode
        # The fault freezes one job, the training job if there is one (as with processes).
        running = [j for j in self.jobs.values() if self._running(j, mode)]
        hung_job = None
        if hung and running:
            hung_job = next((j for j in running if j.record.kind == "training"), running[0])
        infos = []
        for job in self.jobs.values():
            state = self._state(job, mode, hung_job)
            if job.record.kind == "training" and state == "running":
                job.steps += elapsed * SIM_STEPS_PER_S
            throughput = 0.0
            if state == "running":
                throughput = 1.0 if job.record.kind == "training" else INFERENCE_THROUGHPUT
            infos.append(
                JobInfo(
                    job_id=job.record.job_id,
                    kind=job.record.kind,
                    state=state,
                    progress_pct=round(self._progress(job), 3),
                    throughput=throughput,
                    gpu_indices=list(job.record.gpu_indices),
                )
            )
        return infos

    # ------------------------------------------------------------ job actions

    def _view(self, job: SimJob) -> JobView:
        return JobView(
            job_id=job.record.job_id, kind=job.record.kind,
            state=self._state(job, self._mode, None), step=int(job.steps),
            progress_pct=self._progress(job), gpu_indices=job.record.gpu_indices,
            memory_mib=job.record.memory_mib, alive=self._running(job, self._mode),
            busy=job.held,
        )

    def views(self) -> list[JobView]:
        return [self._view(job) for job in self.jobs.values()]

    def view(self, job_id: str) -> JobView | None:
        job = self.jobs.get(job_id)
        return None if job is None else self._view(job)

    def checkpoint_file(self, job_id: str) -> Path | None:
        return None

    def add(self, record: JobRecord, *, step: int, progress_pct: float) -> None:
        self.table.put(record)
        self.jobs[record.job_id] = SimJob(record, steps=float(step))

    def hold(self, job_id: str, grace_s: float) -> None:
        if job_id in self.jobs:
            self.jobs[job_id].held = True

    def settled(self, job_id: str) -> bool:
        return True  # a simulated job stops at once

    def release(self, job_id: str) -> None:
        if job_id in self.jobs:
            self.jobs[job_id].held = False

    def local_checkpoint(self, job_id: str) -> LocalCheckpoint:
        job = self.jobs[job_id]
        return LocalCheckpoint(None, int(job.steps), self._progress(job))

    def forget(self, job_id: str) -> None:
        self.table.remove(job_id)
        self.jobs.pop(job_id, None)

    def resize(self, job_id: str, gpu_indices: tuple[int, ...], memory_mib: int) -> None:
        job = self.jobs[job_id]
        job.record = dataclasses.replace(job.record, gpu_indices=gpu_indices,
                                         memory_mib=memory_mib)
        self.table.put(job.record)

"""What drives a node's jobs: the protocols the report and the job actions use, and what they see.

Both job sources (agent.jobs.processes, agent.jobs.simulated) follow the node's mode the same
way (`wanted`). The job actions (agent.actions) drive them through the same operations: `hold`
asks a job to checkpoint and stop and keeps it down, `settled` says when its process is gone,
`release` lets it run here again, `forget` gives it up. None of them blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from agent.faults import FaultPlan
from agent.jobs.table import JobKind, JobRecord
from schemas.events.v1 import JobInfo, NodeMode

JobState = Literal["starting", "running", "checkpointing", "stopped", "failed", "hung"]


def wanted(kind: JobKind, mode: NodeMode) -> bool:
    """Whether a job of `kind` runs on a node in `mode`."""
    if mode == "offline":
        return False
    # Draining lets running work finish but takes no new requests, so serving stops.
    return mode == "active" or kind == "training"


@dataclass(frozen=True)
class JobView:
    """One owned job as the actions see it."""

    job_id: str
    kind: JobKind
    state: JobState
    step: int
    progress_pct: float
    gpu_indices: tuple[int, ...]
    memory_mib: int
    alive: bool  # its process runs (simulated: it is running)
    busy: bool  # a long action holds it


@dataclass(frozen=True)
class LocalCheckpoint:
    """A stopped job's latest checkpoint on this node (no file: nothing to resume from)."""

    path: Path | None
    step: int
    progress_pct: float


class JobSource(Protocol):
    """Where a report's jobs come from."""

    def start(self) -> None: ...

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None: ...

    def snapshot(self, now: datetime) -> list[JobInfo]: ...

    def close(self) -> None: ...


class JobRunner(JobSource, Protocol):
    """A job source the job actions can drive; no method blocks."""

    def views(self) -> list[JobView]: ...

    def view(self, job_id: str) -> JobView | None: ...

    def checkpoint_file(self, job_id: str) -> Path | None:
        """Where a resumed job's checkpoint must be put; None if the jobs take no file."""
        ...

    def add(self, record: JobRecord, *, step: int, progress_pct: float) -> None:
        """Own and start (if the mode wants) a job, continuing from `step`."""
        ...

    def hold(self, job_id: str, grace_s: float) -> None:
        """Ask the job to checkpoint and stop, and keep it down; SIGKILL after `grace_s`."""
        ...

    def settled(self, job_id: str) -> bool:
        """True once the held job runs no more."""
        ...

    def release(self, job_id: str) -> None:
        """End a hold: the job runs here again if it was running before."""
        ...

    def local_checkpoint(self, job_id: str) -> LocalCheckpoint: ...

    def forget(self, job_id: str) -> None:
        """Give up a stopped job for good (persisted)."""
        ...

    def resize(self, job_id: str, gpu_indices: tuple[int, ...], memory_mib: int) -> None: ...


"""Simulated jobs: a training job that makes progress and an inference service.

They stand in for the real job runners until those exist; the simulated GPU takes its load
from them, so a drained or offline node really goes quiet.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from schemas.events.v1 import JobInfo, NodeMode

JobState = Literal["running", "stopped", "hung"]

TRAINING_RUN_S = 600.0  # one simulated training run, 0 -> 100 %
INFERENCE_THROUGHPUT = 120.0  # requests per second while serving


class SimulatedJobs:
    """A couple of jobs whose progress advances with time and stops when they are hung."""

    def __init__(self, node_id: str, gpus: int, started_at: datetime) -> None:
        self.training_id = f"{node_id}.train"[:128]
        self.inference_id = f"{node_id}.infer"[:128]
        self.gpus = gpus
        self.progress_pct = 0.0
        self.runs = 0
        self._last = started_at

    def _gpu_indices(self, preferred: int) -> list[int]:
        if self.gpus == 0:
            return []
        return [min(preferred, self.gpus - 1)]

    def advance(self, now: datetime, mode: NodeMode, hung: bool) -> list[JobInfo]:
        """The jobs at `now`; progress moves only while the training job runs."""
        elapsed = max(0.0, (now - self._last).total_seconds())
        self._last = now
        # Draining lets running jobs finish their work; offline stops them.
        running = mode != "offline"
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
                gpu_indices=self._gpu_indices(0),
            )
        ]
        # A draining node takes no new requests, so the inference service stops serving.
        if mode == "active":
            jobs.append(
                JobInfo(
                    job_id=self.inference_id,
                    kind="inference",
                    state="running",
                    throughput=INFERENCE_THROUGHPUT,
                    gpu_indices=self._gpu_indices(1),
                )
            )
        return jobs

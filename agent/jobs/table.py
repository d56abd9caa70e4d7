"""The jobs a node owns: the job table (<agent state>/jobs.json).

The table is what the node owns: the configured jobs (AGENT_JOBS) and those start_job brought,
minus those migrated or stopped away. It survives restarts, so a job started here comes back
with the agent and a job moved out never does. A job that the mode stopped is still owned: an
offline node keeps its jobs until they are migrated out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.envelope import IDENTIFIER_MAX

log = logging.getLogger("clusterwarden.agent.jobs")

JobKind = Literal["training", "inference"]

TABLE_FILE = "jobs.json"
MAX_GONE = 1_024  # job ids remembered as given up (only configured ones matter)

# Job name (as in AGENT_JOBS) -> (kind, module, preferred GPU).
JOB_TYPES: dict[str, tuple[JobKind, str, int]] = {
    "train": ("training", "agent.ml.train", 0),
    "infer": ("inference", "agent.ml.infer", 1),
}


def gpu_for(preferred: int, gpus: int) -> list[int]:
    """The GPU a job uses on a node with `gpus` GPUs (none without GPUs)."""
    return [] if gpus == 0 else [min(preferred, gpus - 1)]


@dataclass(frozen=True)
class JobRecord:
    """A job the node owns: what it is and what it may use (not how it is run)."""

    job_id: str
    kind: JobKind
    gpu_indices: tuple[int, ...] = ()
    memory_mib: int = 0


class _RecordFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    job_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")]
    kind: JobKind
    gpu_indices: list[Annotated[int, Field(ge=0, le=63)]] = Field(default_factory=list)
    memory_mib: Annotated[int, Field(ge=0)] = 0


class _TableFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: Literal[1] = 1
    jobs: list[_RecordFile] = Field(default_factory=list)
    gone: list[str] = Field(default_factory=list)


class JobTable:
    """The jobs a node owns, kept in a JSON file (written atomically on every change)."""

    def __init__(self, path: Path | None, configured: Sequence[JobRecord]) -> None:
        self.path = path
        self.records: dict[str, JobRecord] = {}
        self.gone: list[str] = []
        loaded = self._load()
        if loaded is not None:
            self.records = {
                r.job_id: JobRecord(r.job_id, r.kind, tuple(r.gpu_indices), r.memory_mib)
                for r in loaded.jobs
            }
            self.gone = list(loaded.gone)
        # A configured job is owned unless it was given up: a job migrated out of this node
        # must not come back when the agent restarts with the same AGENT_JOBS.
        added = [
            r for r in configured if r.job_id not in self.records and r.job_id not in self.gone
        ]
        for record in added:
            self.records[record.job_id] = record
        if loaded is None or added:
            self._save()

    def _load(self) -> _TableFile | None:
        if self.path is None:
            return None
        try:
            return _TableFile.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as err:
            # Starting from the configuration may bring back a job that moved away; refusing
            # to start would take the node down. The first is the lesser harm, and it is loud.
            log.error("unreadable job table %s (%s): starting from the configured jobs",
                      self.path, err)
            return None

    def _save(self) -> None:
        if self.path is None:
            return
        body = _TableFile(
            jobs=[
                _RecordFile(job_id=r.job_id, kind=r.kind, gpu_indices=list(r.gpu_indices),
                            memory_mib=r.memory_mib)
                for r in self.records.values()
            ],
            gone=self.gone[-MAX_GONE:],
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as out:
            out.write(body.model_dump_json(indent=2).encode())
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)

    def put(self, record: JobRecord) -> None:
        """Own `record` from now on (replacing what was known of the job)."""
        self.records[record.job_id] = record
        if record.job_id in self.gone:
            self.gone.remove(record.job_id)
        self._save()

    def remove(self, job_id: str) -> None:
        """No longer own the job, and remember that (so configuration cannot bring it back)."""
        self.records.pop(job_id, None)
        if job_id not in self.gone:
            self.gone.append(job_id)
        self._save()


def configured_records(node_id: str, gpus: int, names: Sequence[str]) -> list[JobRecord]:
    """The job records of the named jobs (names as in AGENT_JOBS: train, infer)."""
    records = []
    for name in names:
        kind, _, preferred = JOB_TYPES[name]
        records.append(JobRecord(f"{node_id}.{name}"[:IDENTIFIER_MAX], kind,
                                 tuple(gpu_for(preferred, gpus))))
    return records

"""What every ML job process shares: its status file, its stop signals, its throttle."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

STATUS_FILE = "status.json"
CHECKPOINT_FILE = "checkpoint.npz"

# Exit codes the agent can tell apart: 0 is a clean stop (or the end of the work).
EXIT_PARENT_GONE = 3


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file and rename it over `path` (readers never see half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    tmp.replace(path)


def utc_now() -> str:
    """The time now, as ISO 8601 in UTC."""
    return datetime.now(UTC).isoformat()


class StopFlag:
    """Set by SIGTERM or SIGINT; the job loop checks it between steps and stops cleanly."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def install(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    @property
    def requested(self) -> bool:
        return self.signal is not None


class ParentWatch:
    """Notices the agent dying: a job without its agent would run on unseen and unstopped."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    @property
    def gone(self) -> bool:
        # An orphan is adopted by init (or a subreaper), so its parent pid changes.
        return os.getppid() != self.parent


class RateMeter:
    """Items per second since the previous reading."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._count = 0

    def add(self, count: int) -> None:
        self._count += count

    def rate(self) -> float:
        """The rate since the last call, and start a new window."""
        now = self._clock()
        elapsed = now - self._since
        rate = self._count / elapsed if elapsed > 0 else 0.0
        self._since, self._count = now, 0
        return rate


class StatusFile:
    """The small JSON file the agent reads to know how a job is doing."""

    def __init__(self, job_dir: Path, job_id: str, kind: str) -> None:
        self.path = job_dir / STATUS_FILE
        self.fixed = {"job_id": job_id, "kind": kind, "pid": os.getpid()}

    def write(self, state: str, **fields: Any) -> None:
        body: Mapping[str, Any] = {**self.fixed, "state": state, "updated_at": utc_now(), **fields}
        atomic_write(self.path, json.dumps(body, sort_keys=True).encode())


def lower_priority(niceness: int) -> None:
    """Run behind the control plane: on a busy machine the jobs slow down, not the services."""
    if niceness > 0:
        # Not allowed here: run at normal priority.
        with contextlib.suppress(OSError):
            os.nice(niceness)


def job_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every job takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--status-every", type=float, default=1.0, help="seconds")
    parser.add_argument("--step-sleep", type=float, default=0.05,
                        help="seconds of rest after each batch; keeps a job well under 10%% CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nice", type=int, default=5)
    return parser

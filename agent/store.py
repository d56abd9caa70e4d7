"""The shared checkpoint store: where a migrating job's checkpoint waits for its next node.

Layout: <store>/<cluster>/<job_id>/checkpoint.npz and <store>/<cluster>/<job_id>/meta.json
(`checkpoint_dir`): two clusters may both have a `node-001.train`, and one store may serve
both, so each cluster's jobs have a directory of their own. Every file is
written to a temporary name, fsynced and renamed, and meta.json is written last: it is the
commit mark, and it carries the checkpoint's size and SHA-256, so a reader never trusts a
checkpoint that does not match what its exporter wrote. The store is a directory every
node of a fleet can read (local disk for a local fleet; a shared mount in production).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal
from uuid import uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from agent.ml.runtime import CHECKPOINT_FILE

log = logging.getLogger("clusterwarden.agent.store")

META_FILE = "meta.json"
COPY_CHUNK = 1 << 20


class StoreError(Exception):
    """A checkpoint that cannot be used; `reason` is the command result's failure reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class CheckpointMeta(BaseModel):
    """What the store knows about one exported checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cluster_id: str
    job_id: str
    kind: Literal["training", "inference"]
    step: Annotated[int, Field(ge=0)] = 0
    progress_pct: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    from_node: str
    to_node: str | None = None
    saved_at: AwareDatetime
    # An inference job (or a training job stopped before its first checkpoint) moves
    # without a checkpoint file: its next node starts it fresh.
    has_checkpoint: bool = False
    size: Annotated[int, Field(ge=0)] = 0
    sha256: str = ""


def safe_job_id(job_id: str) -> bool:
    """Whether `job_id` is safe as a directory name (the schema's pattern allows '..')."""
    # A leading dot would also collide with the temporary files written next to it.
    return bool(job_id) and not job_id.startswith(".") and "/" not in job_id


def checkpoint_dir(root: Path, cluster: str, job_id: str) -> Path:
    """Where the store keeps one job's export: under its cluster, then its job id."""
    if not safe_job_id(cluster):
        raise ValueError(f"cluster {cluster!r} cannot name a directory")
    if not safe_job_id(job_id):
        raise StoreError("invalid_job_id", f"{job_id!r} cannot name a directory")
    return root / cluster / job_id


def _copy_hashed(source: Path, target: Path) -> tuple[int, str]:
    """Copy `source` to `target` atomically; (size, sha256) of the bytes copied."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid4().hex[:8]}.tmp")
    try:
        with source.open("rb") as src, tmp.open("wb") as dst:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return size, digest.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


class CheckpointStore:
    """One cluster's part of a store directory; every method is a few small file operations
    (no waiting)."""

    def __init__(self, root: Path, cluster: str) -> None:
        self.root = root
        self.cluster = cluster

    def job_path(self, job_id: str) -> Path:
        return checkpoint_dir(self.root, self.cluster, job_id)

    def read(self, job_id: str) -> CheckpointMeta | None:
        """The meta of the job's exported checkpoint; None if none (or it is unreadable)."""
        path = self.job_path(job_id) / META_FILE
        try:
            meta = CheckpointMeta.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as err:
            log.warning("ignoring the unreadable checkpoint meta %s: %s", path, err)
            return None
        if (meta.cluster_id, meta.job_id) != (self.cluster, job_id):
            log.warning("ignoring %s: it describes job %s of cluster %s", path, meta.job_id,
                        meta.cluster_id)
            return None
        return meta

    def export(
        self,
        job_id: str,
        kind: Literal["training", "inference"],
        checkpoint: Path | None,
        *,
        step: int,
        progress_pct: float,
        from_node: str,
        to_node: str | None,
        now: datetime,
    ) -> CheckpointMeta:
        """Publish a job's checkpoint (or just its progress, without a file) to the store."""
        home = self.job_path(job_id)
        home.mkdir(parents=True, exist_ok=True)
        size, sha256 = 0, ""
        if checkpoint is not None:
            size, sha256 = _copy_hashed(checkpoint, home / CHECKPOINT_FILE)
        meta = CheckpointMeta(
            cluster_id=self.cluster, job_id=job_id, kind=kind, step=max(0, step),
            progress_pct=min(100.0, max(0.0, progress_pct)), from_node=from_node,
            to_node=to_node, saved_at=now, has_checkpoint=checkpoint is not None, size=size,
            sha256=sha256,
        )
        # Last: until the meta is renamed into place, readers see the previous export.
        _write_atomic(home / META_FILE, meta.model_dump_json(indent=2).encode())
        log.info("exported job %s (step %d, %s) to %s", job_id, meta.step,
                 "with its checkpoint" if meta.has_checkpoint else "no checkpoint file", home)
        return meta

    def fetch(self, meta: CheckpointMeta, target: Path) -> None:
        """Copy the checkpoint `meta` describes to `target`, checking it is what was exported."""
        source = self.job_path(meta.job_id) / CHECKPOINT_FILE
        try:
            size, sha256 = _copy_hashed(source, target)
        except FileNotFoundError as err:
            raise StoreError("checkpoint_missing", f"{source} is gone") from err
        if (size, sha256) != (meta.size, meta.sha256):
            # Never start from a checkpoint that is not the one exported.
            target.unlink(missing_ok=True)
            raise StoreError(
                "checkpoint_corrupt", f"{source}: {size} bytes, sha256 {sha256[:12]}..."
            )

    def remove(self, job_id: str) -> None:
        """Delete a job's export (operator tooling and tests)."""
        shutil.rmtree(self.job_path(job_id), ignore_errors=True)

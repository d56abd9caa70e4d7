"""The shared checkpoint store: atomic exports, checked fetches, safe names."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from agent.ml.runtime import CHECKPOINT_FILE
from agent.store import META_FILE, CheckpointStore, StoreError, checkpoint_dir, safe_job_id


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoints", "local")


def test_export_then_fetch(store: CheckpointStore, tmp_path: Path, now: datetime) -> None:
    local = tmp_path / "a" / CHECKPOINT_FILE
    local.parent.mkdir()
    local.write_bytes(b"weights" * 1000)
    assert store.read("node-001.train") is None

    meta = store.export("node-001.train", "training", local, step=120, progress_pct=4.5,
                        from_node="node-001", to_node="node-002", now=now)
    assert (meta.step, meta.has_checkpoint, meta.size) == (120, True, 7000)
    assert store.read("node-001.train") == meta
    on_disk = json.loads((store.job_path("node-001.train") / META_FILE).read_text())
    assert (on_disk["from_node"], on_disk["to_node"], on_disk["step"]) == (
        "node-001", "node-002", 120
    )
    assert not [p for p in store.root.rglob("*.tmp")]  # nothing half-written is left

    target = tmp_path / "b" / CHECKPOINT_FILE
    store.fetch(meta, target)
    assert target.read_bytes() == local.read_bytes()


def test_a_checkpoint_that_is_not_the_exported_one_is_refused(
    store: CheckpointStore, tmp_path: Path, now: datetime
) -> None:
    local = tmp_path / CHECKPOINT_FILE
    local.write_bytes(b"good")
    meta = store.export("j1", "training", local, step=1, progress_pct=0.0, from_node="a",
                        to_node=None, now=now)
    (store.job_path("j1") / CHECKPOINT_FILE).write_bytes(b"evil")
    target = tmp_path / "b" / CHECKPOINT_FILE
    with pytest.raises(StoreError) as caught:
        store.fetch(meta, target)
    assert caught.value.reason == "checkpoint_corrupt"
    assert not target.exists()  # never left where a job would resume from it

    (store.job_path("j1") / CHECKPOINT_FILE).unlink()
    with pytest.raises(StoreError, match="checkpoint_missing"):
        store.fetch(meta, target)


def test_a_job_without_a_checkpoint_moves_with_its_progress(
    store: CheckpointStore, now: datetime
) -> None:
    meta = store.export("node-001.infer", "inference", None, step=0, progress_pct=0.0,
                        from_node="node-001", to_node=None, now=now)
    assert (meta.has_checkpoint, meta.sha256) == (False, "")
    assert not (store.job_path("node-001.infer") / CHECKPOINT_FILE).exists()


def test_unreadable_or_foreign_meta_is_no_checkpoint(store: CheckpointStore, now: datetime) -> None:
    home = store.job_path("j1")
    home.mkdir(parents=True)
    (home / META_FILE).write_text("{not json")
    assert store.read("j1") is None
    store.export("j2", "training", None, step=3, progress_pct=1.0, from_node="a",
                 to_node=None, now=now)
    (home / META_FILE).write_bytes((store.job_path("j2") / META_FILE).read_bytes())
    assert store.read("j1") is None  # it describes another job


@pytest.mark.parametrize(("job_id", "safe"), [("node-001.train", True), ("..", False),
                                             (".", False), (".hidden", False), ("", False)])
def test_job_ids_that_cannot_name_a_directory(
    store: CheckpointStore, job_id: str, safe: bool
) -> None:
    assert safe_job_id(job_id) is safe
    if not safe:
        with pytest.raises(StoreError, match="invalid_job_id"):
            store.read(job_id)


def test_two_clusters_share_a_store_but_never_a_checkpoint(tmp_path: Path, now: datetime) -> None:
    root = tmp_path / "checkpoints"
    east, west = CheckpointStore(root, "east"), CheckpointStore(root, "west")
    local = tmp_path / CHECKPOINT_FILE
    local.write_bytes(b"east weights")
    # The same job id in each cluster (both have a node-001 that trains).
    east_meta = east.export("node-001.train", "training", local, step=40, progress_pct=2.0,
                            from_node="node-001", to_node="node-002", now=now)
    assert west.read("node-001.train") is None
    west_meta = west.export("node-001.train", "training", None, step=7, progress_pct=0.5,
                            from_node="node-001", to_node=None, now=now)
    assert (east.read("node-001.train"), west.read("node-001.train")) == (east_meta, west_meta)
    assert east.job_path("node-001.train") == checkpoint_dir(root, "east", "node-001.train")
    assert east.job_path("node-001.train") != west.job_path("node-001.train")
    # A meta copied over from another cluster's export is not this cluster's checkpoint.
    (west.job_path("node-001.train") / META_FILE).write_bytes(
        (east.job_path("node-001.train") / META_FILE).read_bytes())
    assert west.read("node-001.train") is None


@pytest.mark.parametrize("cluster", ["..", ".", "", "a/b"])
def test_a_cluster_that_cannot_name_a_directory_is_refused(tmp_path: Path, cluster: str) -> None:
    with pytest.raises(ValueError, match="cannot name a directory"):
        checkpoint_dir(tmp_path, cluster, "node-001.train")

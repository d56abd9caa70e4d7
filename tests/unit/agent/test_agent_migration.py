"""Job actions with real training processes: a job checkpointed on one node resumes on another.

The path an XID fault takes: node A goes offline (its jobs checkpoint and stop), migrate_job
exports A's checkpoint to the shared store, start_job on B resumes it there with the step
counter continuing. Also: a live migration, a checkpoint timeout, a cancel, a restart for new
GPUs, stop_job, and a job table that survives the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from agent.jobs import JobManager, JobSpec, JobView, job_dir
from agent.ml.runtime import CHECKPOINT_FILE, STATUS_FILE
from agent.ml.train import checkpoint_step
from agent.store import CheckpointStore, checkpoint_dir
from schemas.events.v1 import (
    Cancel,
    DrainNode,
    MigrateJob,
    OfflineNode,
    SetResources,
    StartJob,
    StopJob,
    now_utc,
)
from tests.unit.agent.conftest import Centre, Node, open_node
from tests.waiting import DEADLINE_S, eventually

NODE, OTHER = "node-001", "node-002"
TRAIN = f"{NODE}.train"
FAST = ("--status-every", "0.1", "--step-sleep", "0.005", "--nice", "0")
ARGS: dict[Any, tuple[str, ...]] = {
    "training": (*FAST, "--checkpoint-every", "0.3"), "inference": FAST
}

NodeFactory = Callable[..., Node[JobManager]]


def manager(state_dir: Path, node_id: str, own_job: bool) -> JobManager:
    specs = [JobSpec(f"{node_id}.train", "training", "agent.ml.train", (0,), ARGS["training"])]
    # A job stopped for good gets DEADLINE_S to checkpoint and exit before it is killed: the
    # tests wait for the clean stop, which a loaded machine may only make slower.
    return JobManager(specs if own_job else [], state_dir, hung_after_s=30.0,
                      stop_timeout_s=DEADLINE_S, args_by_kind=ARGS)


@pytest.fixture
async def nodes(
    tmp_path: Path, centre: Centre, now: datetime
) -> AsyncIterator[NodeFactory]:
    store = CheckpointStore(tmp_path / "checkpoints", "local")
    made: list[Node[JobManager]] = []

    def make(node_id: str, own_job: bool = True) -> Node[JobManager]:
        state_dir = tmp_path / "agents" / node_id
        state_dir.mkdir(parents=True, exist_ok=True)
        node = open_node(node_id, state_dir, manager(state_dir, node_id, own_job), centre, now,
                         store, stop_timeout_s=DEADLINE_S)
        node.jobs.start()
        made.append(node)
        return node

    yield make
    for node in made:
        await node.executor.shutdown()
        await asyncio.to_thread(node.jobs.close)
        node.journal.close()


async def until(
    node: Node[JobManager], job_id: str, check: Callable[[JobView], bool],
    timeout_s: float = DEADLINE_S,
) -> JobView:
    """Tend the node's jobs (as the agent does) until the job's view passes `check`."""
    deadline = time.monotonic() + timeout_s
    view = node.jobs.view(job_id)
    while time.monotonic() < deadline:
        node.tend()
        view = node.jobs.view(job_id)
        if view is not None and check(view):
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} on {node.node_id} never matched: {view}")


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def status(node: Node[JobManager], job_id: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (job_dir(node.state_dir, job_id) / STATUS_FILE).read_text()
    )
    return loaded


async def test_an_offline_nodes_job_resumes_on_another_node(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    source, target = nodes(NODE), nodes(OTHER, own_job=False)
    await until(source, TRAIN, lambda v: v.state == "running" and v.step >= 20)

    # The XID path: drained, then offline; the job checkpoints and stops, and stays owned.
    source.answer(DrainNode(node_id=NODE))
    source.answer(OfflineNode(node_id=NODE))
    stopped = await until(source, TRAIN, lambda v: v.state == "stopped")
    stopped_at = status(source, TRAIN)["step"]
    assert stopped.step == stopped_at
    assert source.jobs.snapshot(now_utc())[0].state == "stopped"

    migrated = await source.run(MigrateJob(node_id=NODE, job_id=TRAIN, to_node_id=OTHER))
    assert (migrated.outcome, migrated.reason) == ("succeeded", "")
    assert (migrated.outputs["step"], migrated.outputs["has_checkpoint"]) == (stopped_at, True)
    exported = checkpoint_dir(tmp_path / "checkpoints", "local", TRAIN) / CHECKPOINT_FILE
    assert checkpoint_step(exported) == stopped_at
    assert source.jobs.views() == []
    assert source.jobs.snapshot(now_utc()) == []

    started = target.answer(
        StartJob(node_id=OTHER, job_id=TRAIN, kind="training", checkpoint=TRAIN)
    )
    assert (started.outcome, started.outputs["resumed_step"]) == ("succeeded", stopped_at)
    # Until the resumed process reports, the job shows where it stopped, not 0 %.
    first = target.jobs.snapshot(now_utc())[0]
    assert first.progress_pct == pytest.approx(migrated.outputs["progress_pct"], abs=1e-3)
    resumed = await until(target, TRAIN, lambda v: v.state == "running" and v.step > stopped_at)
    assert status(target, TRAIN)["resumed_from_step"] == stopped_at
    assert resumed.progress_pct >= float(migrated.outputs["progress_pct"])
    assert list(target.jobs.pids()) == [TRAIN]


async def test_a_running_job_migrates_with_the_checkpoint_it_writes_as_it_stops(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    source = nodes(NODE)
    await until(source, TRAIN, lambda v: v.state == "running" and v.step >= 10)
    pid = source.jobs.pids()[TRAIN]
    migrated = await source.run(
        MigrateJob(node_id=NODE, job_id=TRAIN, checkpoint_timeout_s=DEADLINE_S)
    )
    assert migrated.outcome == "succeeded"
    assert status(source, TRAIN)["state"] == "stopped"  # SIGTERM: a clean stop, not a kill
    assert migrated.outputs["step"] == status(source, TRAIN)["step"]
    assert migrated.outputs["step"] == checkpoint_step(
        checkpoint_dir(tmp_path / "checkpoints", "local", TRAIN) / CHECKPOINT_FILE
    )
    source.tend()
    assert source.jobs.pids() == {}  # never restarted here
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_checkpoint_timeout_leaves_the_job_running_here(nodes: NodeFactory) -> None:
    source = nodes(NODE)
    # Running, with a checkpoint on disk already (so it resumes from one whatever happens).
    await until(source, TRAIN, lambda v: v.state == "running"
                and (job_dir(source.state_dir, TRAIN) / CHECKPOINT_FILE).exists())
    pid = source.jobs.pids()[TRAIN]
    # A job that cannot checkpoint in time, however fast the machine: frozen (outside the
    # agent's knowledge), it keeps SIGTERM pending and never exits, so any timeout fires.
    os.kill(pid, signal.SIGSTOP)
    try:
        await eventually(lambda: proc_state(pid) == "T", f"job pid {pid} stopped")
        failed = await source.run(
            MigrateJob(node_id=NODE, job_id=TRAIN, checkpoint_timeout_s=0.2)
        )
        assert (failed.outcome, failed.reason) == ("failed", "checkpoint_timeout")
        assert source.jobs.pids() == {TRAIN: pid}  # still here: not exported, not given up
    finally:
        os.kill(pid, signal.SIGCONT)
    # It had been asked to stop: thawed, it checkpoints, exits and comes back from that.
    await until(source, TRAIN, lambda v: v.state == "running"
                and status(source, TRAIN).get("resumed_from_step") is not None)
    assert source.jobs.pids()[TRAIN] != pid
    assert source.job_ids() == [TRAIN]


async def test_a_cancel_before_the_migration_ran_leaves_the_job_alone(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    source = nodes(NODE)
    await until(source, TRAIN, lambda v: v.state == "running")
    pid = source.jobs.pids()[TRAIN]
    command_id = uuid4()
    assert source.send(MigrateJob(node_id=NODE, job_id=TRAIN), command_id=command_id) is None
    task = source.executor.running()[command_id]
    cancel = source.answer(Cancel(node_id=NODE, command_id=command_id))
    assert cancel.outputs["cancelled"] is True
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Its answer is published from a callback, a moment later.
    await eventually(lambda: source.published, "the cancelled migration's answer")
    assert [(r.command_id, r.outcome, r.reason) for r in source.published] == [
        (command_id, "failed", "cancelled")
    ]
    assert source.journal.in_progress() == []
    assert source.jobs.pids() == {TRAIN: pid}  # never even asked to stop
    assert not (checkpoint_dir(tmp_path / "checkpoints", "local", TRAIN)).exists()


async def test_new_gpus_restart_a_training_job_from_its_checkpoint(nodes: NodeFactory) -> None:
    node = nodes(NODE)
    await until(node, TRAIN, lambda v: v.state == "running" and v.step >= 10)
    pid = node.jobs.pids()[TRAIN]
    resized = await node.run(SetResources(node_id=NODE, job_id=TRAIN, gpus=2, memory_mib=2048))
    assert (resized.outcome, resized.outputs["restarted"], resized.outputs["gpu_indices"]) == (
        "succeeded", True, "0,1"
    )
    view = await until(node, TRAIN, lambda v: v.state == "running")
    assert view.gpu_indices == (0, 1)
    assert node.jobs.pids()[TRAIN] != pid
    assert status(node, TRAIN)["resumed_from_step"] is not None
    assert node.jobs.snapshot(now_utc())[0].gpu_indices == [0, 1]


async def test_stop_job_checkpoints_and_gives_the_job_up(nodes: NodeFactory) -> None:
    node = nodes(NODE)
    await until(node, TRAIN, lambda v: v.state == "running")
    stopped = await node.run(StopJob(node_id=NODE, job_id=TRAIN))
    assert (stopped.outcome, stopped.outputs["has_checkpoint"]) == ("succeeded", True)
    assert status(node, TRAIN)["state"] == "stopped"
    node.tend()
    assert (node.jobs.pids(), node.job_ids()) == ({}, [])


async def test_a_started_job_comes_back_with_its_agent(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    target = nodes(OTHER, own_job=False)
    started = target.answer(StartJob(node_id=OTHER, job_id="j1", kind="training"))
    assert started.outputs["resumed_step"] == 0
    await until(target, "j1", lambda v: v.state == "running" and v.step >= 5)
    await asyncio.to_thread(target.jobs.close)  # the agent stops: the job checkpoints

    again = manager(target.state_dir, OTHER, own_job=False)
    try:
        assert again.view("j1") is not None
        again.start()
        target.jobs = again
        await until(target, "j1", lambda v: v.state == "running")
        assert status(target, "j1")["resumed_from_step"] is not None
    finally:
        await asyncio.to_thread(again.close)

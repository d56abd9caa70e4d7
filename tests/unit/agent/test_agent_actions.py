"""The job actions through the command executor, on simulated jobs (no processes).

Preconditions, outputs, idempotency, dry runs, injected failures, and the life of a long
action: in progress for query_status, silent for its duplicates, cancellable, interrupted by
a restart. tests/unit/agent/test_agent_migration.py does the same with real job processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from agent.actions import PERMANENT_REASONS, place
from agent.commands import CommandExecutor
from agent.faults import FaultPlan, write_faults
from agent.jobs import TABLE_FILE, JobRunner, JobView, SimulatedJobs
from agent.store import CheckpointStore, checkpoint_dir
from schemas.events.v1 import (
    Cancel,
    DrainNode,
    MigrateJob,
    OfflineNode,
    QueryStatus,
    SetResources,
    StartJob,
    StopJob,
)
from tests.unit.agent.conftest import Centre, Node, open_node
from tests.waiting import eventually

NODE, OTHER = "node-001", "node-002"
TRAIN, INFER = f"{NODE}.train", f"{NODE}.infer"


class SlowJobs(SimulatedJobs):
    """Simulated jobs whose checkpoint is written only when the test says so."""

    checkpointed = False

    def settled(self, job_id: str) -> bool:
        return self.checkpointed


async def held(node: Node[SimulatedJobs], job_id: str) -> JobView:
    """Wait until a long action under way holds the job (it stopped it and now waits)."""
    def busy() -> JobView | None:
        view = node.jobs.view(job_id)
        return view if view is not None and view.busy else None

    return await eventually(busy, f"a long action holds {job_id}")


async def answered(node: Node[SimulatedJobs], count: int = 1) -> None:
    """Wait until `count` long actions have published their answer (from a callback)."""
    await eventually(lambda: len(node.published) >= count,
                     f"{count} published answer(s) on {node.node_id}")


NodeFactory = Callable[..., Node[SimulatedJobs]]


@pytest.fixture
async def nodes(
    tmp_path: Path, centre: Centre, now: datetime
) -> AsyncIterator[NodeFactory]:
    store = CheckpointStore(tmp_path / "checkpoints", "local")
    made: list[Node[SimulatedJobs]] = []

    def make(
        node_id: str = NODE,
        names: tuple[str, ...] = ("train", "infer"),
        jobs_type: type[SimulatedJobs] = SimulatedJobs,
        gpus: int = 2,
    ) -> Node[SimulatedJobs]:
        state_dir = tmp_path / "agents" / node_id
        state_dir.mkdir(parents=True, exist_ok=True)
        jobs = jobs_type(node_id, gpus, now, names=names, state_dir=state_dir)
        node = open_node(node_id, state_dir, jobs, centre, now, store, gpus=gpus)
        made.append(node)
        return node

    yield make
    for node in made:
        await node.executor.shutdown()
        node.journal.close()


# ---------------------------------------------------------------- migrate and start


async def test_a_migration_moves_the_job_and_its_step_counter(
    nodes: NodeFactory, tmp_path: Path, now: datetime
) -> None:
    source, target = nodes(NODE), nodes(OTHER, names=())
    source.jobs.advance(now + timedelta(seconds=60), "active", hung=False)  # 600 steps
    command_id = uuid4()
    assert source.send(MigrateJob(node_id=NODE, job_id=TRAIN, to_node_id=OTHER),
                       command_id=command_id) is None  # the answer comes when it is done
    in_progress = source.answer(QueryStatus(node_id=NODE, command_id=command_id))
    assert (in_progress.outcome, in_progress.reason) == ("unknown", "in_progress")
    assert in_progress.outputs["job_id"] == TRAIN

    migrated = await source.executor.running()[command_id]
    assert (migrated.outcome, migrated.action, migrated.command_id) == (
        "succeeded", "migrate_job", command_id
    )
    assert migrated.outputs == {
        "job_id": TRAIN, "checkpoint": TRAIN, "kind": "training", "step": 600,
        "progress_pct": 10.0, "has_checkpoint": False, "changed": True, "to_node_id": OTHER,
    }
    assert source.published == [migrated]
    assert source.job_ids() == [INFER]  # given up here: it must not run twice
    assert [j.job_id for j in source.jobs.snapshot(now + timedelta(seconds=61))] == [INFER]
    done = source.answer(QueryStatus(node_id=NODE, command_id=command_id))
    assert (done.outcome, done.outputs["step"]) == ("succeeded", 600)

    started = target.answer(
        StartJob(node_id=OTHER, job_id=TRAIN, kind="training", checkpoint=TRAIN)
    )
    assert (started.outcome, started.reason) == ("succeeded", "")
    assert started.outputs == {
        "job_id": TRAIN, "kind": "training", "started": True, "resumed_step": 600,
        "progress_pct": 10.0, "gpu_indices": "0", "changed": True, "checkpoint": TRAIN,
        "resumed_from_node": NODE,
    }
    # The step counter continues where the source left it.
    target.jobs.advance(now, "active", hung=False)
    report = target.jobs.advance(now + timedelta(seconds=60), "active", hung=False)
    assert [(j.job_id, j.state) for j in report] == [(TRAIN, "running")]
    assert report[0].progress_pct == pytest.approx(20.0)


async def test_migrate_job_is_idempotent_and_rechecks_the_job_is_here(
    nodes: NodeFactory
) -> None:
    source, other = nodes(NODE), nodes(OTHER)
    first = await source.run(MigrateJob(node_id=NODE, job_id=TRAIN))
    assert first.outputs["changed"] is True
    # A retry with a new command id: the job is out already, and its export is ours.
    again = source.answer(MigrateJob(node_id=NODE, job_id=TRAIN))
    assert (again.outcome, again.outputs["changed"], again.outputs["step"]) == (
        "succeeded", False, first.outputs["step"]
    )
    # Another node never ran it, and exported nothing of it.
    elsewhere = other.answer(MigrateJob(node_id=OTHER, job_id=TRAIN))
    assert (elsewhere.outcome, elsewhere.reason) == ("failed", "job_not_here")
    unknown = source.answer(MigrateJob(node_id=NODE, job_id="no-such-job"))
    assert (unknown.outcome, unknown.reason) == ("failed", "job_not_here")
    assert "job_not_here" in PERMANENT_REASONS


async def test_an_offline_node_still_owns_its_jobs_until_they_are_migrated(
    nodes: NodeFactory, now: datetime
) -> None:
    source = nodes(NODE)
    source.answer(DrainNode(node_id=NODE))
    source.answer(OfflineNode(node_id=NODE))
    report = source.jobs.snapshot(now)
    assert [(j.job_id, j.state) for j in report] == [(TRAIN, "stopped"), (INFER, "stopped")]
    for job_id in (TRAIN, INFER):
        moved = await source.run(MigrateJob(node_id=NODE, job_id=job_id))
        assert (moved.outcome, moved.outputs["job_id"]) == ("succeeded", job_id)
    assert source.jobs.snapshot(now) == []


async def test_start_job_preconditions(nodes: NodeFactory) -> None:
    node = nodes(OTHER, names=("train",))
    own = f"{OTHER}.train"
    missing = node.answer(StartJob(node_id=OTHER, job_id="j1", checkpoint="j1"))
    assert (missing.outcome, missing.reason) == ("failed", "checkpoint_missing")
    bad = node.answer(StartJob(node_id=OTHER, job_id="..", kind="inference"))
    assert (bad.outcome, bad.reason) == ("failed", "invalid_job_id")

    already = node.answer(StartJob(node_id=OTHER, job_id=own))
    assert (already.outcome, already.outputs["changed"], already.outputs["started"]) == (
        "succeeded", False, False
    )
    fresh = node.answer(StartJob(node_id=OTHER, job_id="j1", kind="inference"))
    assert (fresh.outputs["resumed_step"], fresh.outputs["changed"]) == (0, True)
    # The GPU fewest jobs use: GPU 0 has the node's own training job.
    assert fresh.outputs["gpu_indices"] == "1"
    assert node.job_ids() == [own, "j1"]

    node.answer(DrainNode(node_id=OTHER))
    draining = node.answer(StartJob(node_id=OTHER, job_id="j2"))
    assert (draining.outcome, draining.reason) == ("failed", "node_not_active")
    assert {"node_not_active", "checkpoint_missing", "invalid_job_id"} <= PERMANENT_REASONS
    assert node.job_ids() == [own, "j1"]


def test_placement() -> None:
    def view(job_id: str, *gpus: int) -> JobView:
        return JobView(job_id, "training", "running", 0, 0.0, gpus, 0, True, False)

    assert place([], 0, "j") == ()
    assert place([view("a", 0), view("b", 1), view("c", 0)], 3, "j") == (2,)
    assert place([view("a", 0), view("b", 1)], 2, "j") == (0,)
    assert place([view("j", 0), view("b", 1)], 2, "j") == (0,)  # its own old place is free


# ---------------------------------------------------------------- stop and resources


async def test_stop_job_gives_the_job_up(nodes: NodeFactory) -> None:
    node = nodes(NODE)
    stopped = await node.run(StopJob(node_id=NODE, job_id=INFER))
    assert (stopped.outcome, stopped.outputs["stopped"], stopped.outputs["changed"]) == (
        "succeeded", True, True
    )
    assert node.job_ids() == [TRAIN]
    again = node.answer(StopJob(node_id=NODE, job_id=INFER))
    assert (again.outcome, again.outputs) == (
        "succeeded", {"job_id": INFER, "stopped": False, "changed": False}
    )


async def test_set_resources(nodes: NodeFactory, now: datetime) -> None:
    node = nodes(NODE, gpus=4)
    absent = node.answer(SetResources(node_id=NODE, job_id="j9", gpus=1, memory_mib=0))
    assert (absent.outcome, absent.reason) == ("failed", "job_not_here")
    too_many = node.answer(SetResources(node_id=NODE, job_id=TRAIN, gpus=5, memory_mib=0))
    assert (too_many.outcome, too_many.reason) == ("failed", "insufficient_gpus")
    assert too_many.outputs["node_gpus"] == 4

    # New GPUs for a running training job: a restart from its checkpoint (a long action).
    resized = await node.run(SetResources(node_id=NODE, job_id=TRAIN, gpus=2, memory_mib=4096))
    assert resized.outputs == {
        "job_id": TRAIN, "kind": "training", "gpus": 2, "gpu_indices": "0,1",
        "memory_mib": 4096, "previous_gpu_indices": "0", "previous_memory_mib": 0,
        "restarted": True, "changed": True,
    }
    report = node.jobs.snapshot(now)
    assert (report[0].job_id, report[0].state, report[0].gpu_indices) == (TRAIN, "running", [0, 1])
    same = node.answer(SetResources(node_id=NODE, job_id=TRAIN, gpus=2, memory_mib=4096))
    assert (same.outputs["changed"], same.outputs["restarted"]) == (False, False)
    # Memory alone, or an inference job: recorded at once, no restart.
    memory = node.answer(SetResources(node_id=NODE, job_id=INFER, gpus=0, memory_mib=512))
    assert (memory.outcome, memory.outputs["restarted"], memory.outputs["gpu_indices"]) == (
        "succeeded", False, ""
    )
    assert node.jobs.view(INFER) is not None
    assert node.jobs.table.records[INFER].memory_mib == 512  # persisted with the table


# ---------------------------------------------------------------- dry runs and faults


async def test_dry_runs_change_nothing(nodes: NodeFactory) -> None:
    source, target = nodes(NODE), nodes(OTHER, names=())
    dry = source.answer(MigrateJob(node_id=NODE, job_id=TRAIN, to_node_id=OTHER), dry_run=True)
    assert (dry.outcome, dry.outputs["dry_run"], dry.outputs["job_id"]) == (
        "succeeded", True, TRAIN
    )
    assert "export it to the checkpoint store" in str(dry.outputs["plan"])
    assert source.job_ids() == [TRAIN, INFER]
    assert source.executor.running() == {}
    assert source.jobs.table.gone == []

    start = target.answer(StartJob(node_id=OTHER, job_id=TRAIN, checkpoint=TRAIN),
                          dry_run=True)
    assert (start.outcome, start.reason) == ("failed", "checkpoint_missing")  # still checked
    fresh = target.answer(StartJob(node_id=OTHER, job_id="j1"), dry_run=True)
    assert (fresh.outcome, fresh.outputs["started"]) == ("succeeded", True)
    assert str(fresh.outputs["plan"]).startswith("start training job j1 fresh")
    stop = source.answer(StopJob(node_id=NODE, job_id=INFER), dry_run=True)
    resources = source.answer(SetResources(node_id=NODE, job_id=TRAIN, gpus=2, memory_mib=1),
                              dry_run=True)
    assert (stop.outcome, resources.outputs["restarted"]) == ("succeeded", True)
    assert target.job_ids() == []
    assert source.job_ids() == [TRAIN, INFER]
    view = source.jobs.view(TRAIN)
    assert view is not None
    assert view.gpu_indices == (0,)


async def test_an_injected_failure_leaves_the_job_running_here(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    source = nodes(NODE)
    write_faults(source.state_dir, FaultPlan(fail_actions=["migrate_job", "start_job"]))
    failed = source.answer(MigrateJob(node_id=NODE, job_id=TRAIN))
    assert (failed.outcome, failed.reason) == ("failed", "injected_failure")
    assert source.job_ids() == [TRAIN, INFER]
    assert not (checkpoint_dir(tmp_path / "checkpoints", "local", TRAIN)).exists()
    start = source.answer(StartJob(node_id=NODE, job_id="j1"))
    assert (start.outcome, start.reason) == ("failed", "injected_failure")
    # Other job actions are unaffected.
    stopped = await source.run(StopJob(node_id=NODE, job_id=INFER))
    assert stopped.outcome == "succeeded"


# ---------------------------------------------------------------- long actions


async def test_a_running_migration_can_be_queried_and_cancelled(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    source = nodes(NODE, jobs_type=SlowJobs)
    command_id = uuid4()
    migrate = MigrateJob(node_id=NODE, job_id=TRAIN, checkpoint_timeout_s=60.0)
    assert source.send(migrate, command_id=command_id) is None
    view = await held(source, TRAIN)  # it holds the job and waits for its checkpoint
    assert (view.busy, view.state) == (True, "stopped")

    query = source.answer(QueryStatus(node_id=NODE, command_id=command_id))
    assert (query.outcome, query.reason) == ("unknown", "in_progress")
    # The same command again (redelivered): no second migration, no answer but the real one.
    assert source.executor.handle(
        source.centre.command(migrate, node=NODE, seq=1, command_id=command_id), source.now
    ) is None
    busy = source.answer(MigrateJob(node_id=NODE, job_id=TRAIN))
    assert (busy.outcome, busy.reason) == ("failed", "job_busy")
    dry = source.answer(Cancel(node_id=NODE, command_id=command_id), dry_run=True)
    assert (dry.outputs["cancelled"], command_id in source.executor.running()) == (True, True)

    cancel = source.answer(Cancel(node_id=NODE, command_id=command_id))
    assert (cancel.outcome, cancel.outputs["cancelled"], cancel.outputs["queried_action"]) == (
        "succeeded", True, "migrate_job"
    )
    await answered(source)
    assert [(r.command_id, r.outcome, r.reason) for r in source.published] == [
        (command_id, "failed", "cancelled")
    ]
    again = source.jobs.view(TRAIN)
    assert again is not None
    assert (again.busy, again.state) == (False, "running")  # it runs here again
    assert not (checkpoint_dir(tmp_path / "checkpoints", "local", TRAIN)).exists()
    after = source.answer(QueryStatus(node_id=NODE, command_id=command_id))
    assert (after.outcome, after.reason) == ("failed", "cancelled")
    late = source.answer(Cancel(node_id=NODE, command_id=command_id))
    assert (late.outputs["cancelled"], late.outputs["queried_outcome"]) == (False, "failed")


async def test_a_checkpoint_timeout_keeps_the_job_here(nodes: NodeFactory) -> None:
    source = nodes(NODE, jobs_type=SlowJobs)
    jobs = source.jobs
    assert isinstance(jobs, SlowJobs)
    # SlowJobs never checkpoints until told: any timeout fires, however fast the machine is
    # (a short one only keeps the test quick).
    result = await source.run(MigrateJob(node_id=NODE, job_id=TRAIN, checkpoint_timeout_s=0.05))
    assert (result.outcome, result.reason) == ("failed", "checkpoint_timeout")
    assert "checkpoint_timeout" not in PERMANENT_REASONS  # a retry may well succeed
    view = source.jobs.view(TRAIN)
    assert view is not None
    assert (view.busy, view.state) == (False, "running")
    jobs.checkpointed = True
    retried = await source.run(MigrateJob(node_id=NODE, job_id=TRAIN))
    assert retried.outcome == "succeeded"


async def test_a_restart_interrupts_a_running_migration(
    nodes: NodeFactory, centre: Centre, now: datetime
) -> None:
    source = nodes(NODE, jobs_type=SlowJobs)
    command_id = uuid4()
    assert source.send(MigrateJob(node_id=NODE, job_id=TRAIN), command_id=command_id) is None
    await held(source, TRAIN)  # under way: waiting for a checkpoint that never comes
    # Shutting down answers it: failed, interrupted, and the job stays (and runs) here.
    await source.executor.shutdown()
    assert [(r.outcome, r.reason) for r in source.published] == [("failed", "interrupted")]
    view = source.jobs.view(TRAIN)
    assert view is not None
    assert view.busy is False

    # A crash answers nothing: the next executor finds it in progress and ends it.
    crashed = uuid4()
    assert source.send(MigrateJob(node_id=NODE, job_id=TRAIN), command_id=crashed) is None
    assert source.journal.in_progress() == [crashed]
    restarted = CommandExecutor(NODE, "local", centre.verifier, source.journal)
    assert source.journal.in_progress() == []
    answer = restarted.handle(
        centre.command(QueryStatus(node_id=NODE, command_id=crashed), seq=99), now
    )
    assert answer is not None
    assert (answer.outcome, answer.reason) == ("failed", "interrupted")


async def test_the_job_table_survives_a_restart(nodes: NodeFactory, now: datetime) -> None:
    source, target = nodes(NODE), nodes(OTHER, names=())
    await source.run(MigrateJob(node_id=NODE, job_id=TRAIN))
    target.answer(StartJob(node_id=OTHER, job_id=TRAIN, checkpoint=TRAIN))
    assert (source.state_dir / TABLE_FILE).exists()

    # The same configuration again: what moved out stays out, what moved in comes back.
    again: JobRunner = SimulatedJobs(NODE, 2, now, state_dir=source.state_dir)
    assert [v.job_id for v in again.views()] == [INFER]
    arrived = SimulatedJobs(OTHER, 2, now, names=(), state_dir=target.state_dir)
    assert [(v.job_id, v.kind, v.gpu_indices) for v in arrived.views()] == [
        (TRAIN, "training", (0,))
    ]
    # Back on its first node (a later migration): owned there again.
    await target.run(MigrateJob(node_id=OTHER, job_id=TRAIN))
    source.answer(StartJob(node_id=NODE, job_id=TRAIN, checkpoint=TRAIN))
    back = SimulatedJobs(NODE, 2, now, state_dir=source.state_dir)
    assert sorted(v.job_id for v in back.views()) == [INFER, TRAIN]


async def test_two_actions_accepted_at_once_never_both_act(nodes: NodeFactory) -> None:
    # Both accepted before either ran: each decides again when it starts.
    slow = nodes(NODE, jobs_type=SlowJobs)
    first, second = uuid4(), uuid4()
    assert slow.send(MigrateJob(node_id=NODE, job_id=TRAIN), command_id=first) is None
    assert slow.send(StopJob(node_id=NODE, job_id=TRAIN), command_id=second) is None
    stopped = await slow.executor.running()[second]
    assert (stopped.outcome, stopped.reason) == ("failed", "job_busy")
    jobs = slow.jobs
    assert isinstance(jobs, SlowJobs)
    jobs.checkpointed = True
    migrated = await slow.executor.running()[first]
    assert migrated.outcome == "succeeded"

    quick = nodes(OTHER)
    own = f"{OTHER}.train"
    ids = [uuid4(), uuid4()]
    for command_id in ids:
        assert quick.send(MigrateJob(node_id=OTHER, job_id=own), command_id=command_id) is None
    tasks = [quick.executor.running()[command_id] for command_id in ids]
    results = [await task for task in tasks]
    assert [(r.outcome, r.outputs["changed"]) for r in results] == [
        ("succeeded", True), ("succeeded", False)
    ]

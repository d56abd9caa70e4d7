"""The centre: guards on fresh state, capacity through a provider, child tasks for moves.

Cluster state is real (the collector's script on the redis-server at REDIS_URL, a fresh
namespace per test); the capacity provider is a fake that records its calls.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from schemas.events.v1 import (
    AddCapacity,
    DrainNode,
    Evidence,
    Guard,
    JobInfo,
    MigrateJob,
    MigrateJobs,
    NodeMode,
    NodeReport,
    OpsTask,
    ReleaseNode,
    RemoveCapacity,
    RestartAgent,
    StartJob,
    Step,
    StepAction,
    now_utc,
    state_from_mode,
)
from schemas.ranges import Band, Ranges
from services.capacity.local import LocalProvider
from services.capacity.provider import NodeOffer, NoneProvider
from services.capacity.settings import CapacitySettings
from services.collector.store import NodeStore
from services.executor.centre import (
    Centre,
    build_centre,
    child_task_id,
)
from services.executor.cluster_view import ClusterView
from services.executor.ports import Completed, Failed, Waiting
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys
from tests.contracts.examples import example

CLUSTER = "c1"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NEED = UUID(int=7)






JobState = Literal["starting", "running", "checkpointing", "stopped", "failed", "hung"]


class Cluster:
    """Nodes as their agents report them, through the collector's own script."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self.store = NodeStore(redis, keys, require_registration=False)
        self.seq = 0

    async def node(self, node: str, util: float, *, gpus: int = 4, jobs: int = 0,
                   mode: NodeMode = "active", pool: str = "default",
                   job_state: JobState = "running") -> None:
        self.seq += 1
        template = example("node_report", NodeReport)
        report = template.model_copy(update={
            "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": CLUSTER,
            "node_id": node, "subject": node, "seq": self.seq, "pool": pool, "mode": mode,
            "faults": [],
            "gpus": [template.gpus[0].model_copy(update={"index": i}) for i in range(gpus)],
            "jobs": [JobInfo(job_id=f"{node}-j{i}", kind="training", state=job_state)
                     for i in range(jobs)],
        })
        await self.store.apply_reports([(report, state_from_mode(mode), util)], 1.5)


class FakeProvider:
    """Offers fixed standby nodes; acquiring one makes it report up (as an agent would)."""

    name = "fake"

    def __init__(self, cluster: Cluster, offers: list[NodeOffer],
                 owned: list[str] | None = None, fail: bool = False) -> None:
        self.cluster = cluster
        self.offers = offers
        self._owned = owned or []
        self.fail = fail
        self.calls: list[tuple[Any, ...]] = []

    async def standby(self, cluster: str, pool: str) -> list[NodeOffer]:
        if self.fail:
            raise ConnectionError("provider down")
        return list(self.offers)

    async def acquire(self, cluster: str, pool: str, node_ids: list[str],
                      request_id: str) -> list[str]:
        self.calls.append(("acquire", pool, tuple(node_ids), request_id))
        for node in node_ids:
            gpus = next(o.gpus for o in self.offers if o.node_id == node)
            await self.cluster.node(node, 0.0, gpus=gpus, pool=pool)
        return node_ids

    async def release(self, cluster: str, node_id: str, request_id: str) -> bool:
        self.calls.append(("release", node_id, request_id))
        return node_id in self._owned

    async def owned(self, cluster: str, pool: str) -> list[str]:
        return list(self._owned)

    async def restart_agent(self, cluster: str, node_id: str, request_id: str) -> None:
        self.calls.append(("restart_agent", node_id, request_id))
        if not self.fail:  # the agent comes back and reports
            await self.cluster.node(node_id, 10.0)


def task(*actions: StepAction, target: str = "default", guard: Guard | None = None,
         dry_run: bool = False, need_kind: str = "scale_out",
         ranges: Ranges | None = None) -> OpsTask:
    evidence = Evidence(metric="pool_effective_utilization_pct", value=85.0, range_low=20.0,
                        range_high=80.0, observed_at=T0)
    return OpsTask.model_validate({
        "event_id": uuid4(), "source": "templater", "occurred_at": T0, "cluster_id": CLUSTER,
        "subject": target, "task_id": uuid4(), "need_id": NEED, "need_kind": need_kind,
        "template": "scale_out", "pool": "default", "target": target, "priority": 4,
        "mutex_keys": [f"pool.{CLUSTER}.default"], "dry_run": dry_run,
        "steps": [Step(index=i, name=f"s{i}", action=a, guard=guard)
                  for i, a in enumerate(actions)],
        "evidence": [evidence], "ranges": ranges,
    })


def centre(cluster: Cluster, provider: Any, **settings: Any) -> Centre:
    capacity = CapacitySettings(**({"ready_timeout_s": 0.0} | settings))
    return Centre(ClusterView(cluster.redis, cluster.keys), provider, capacity,
                  clock=lambda: T0)


@pytest.fixture
def cluster(redis: Redis, keys: Keys) -> Cluster:
    return Cluster(redis, keys)


async def five_at_85(cluster: Cluster) -> None:
    for i in range(1, 6):
        await cluster.node(f"node-{i}", 85.0, jobs=2)


# ---------------------------------------------------------------- guards


async def test_guards_are_checked_on_fresh_state(cluster: Cluster) -> None:
    await five_at_85(cluster)
    plain = centre(cluster, NoneProvider())
    above = task(AddCapacity(pool="default"), guard="pool_above_range")
    assert await plain.check_guard(above, above.steps[0]) == (
        True, "pool default at 85.0% (5 nodes up) above 80%")
    below = task(RemoveCapacity(pool="default"), guard="pool_below_range")
    holds, reason = await plain.check_guard(below, below.steps[0])
    assert (holds, reason) == (False, "pool default at 85.0% (5 nodes up) not below 20%")
    unguarded = task(AddCapacity(pool="default"))
    assert await plain.check_guard(unguarded, unguarded.steps[0]) == (True, "no guard")
    has_jobs = task(MigrateJobs(pool="default", node_id="node-1"), guard="node_has_jobs")
    assert (await plain.check_guard(has_jobs, has_jobs.steps[0]))[0] is True
    await cluster.node("node-9", 10.0)
    empty = task(MigrateJobs(pool="default", node_id="node-9"), guard="node_has_jobs")
    assert (await plain.check_guard(empty, empty.steps[0]))[0] is False


async def test_guards_check_the_ranges_the_task_carries(cluster: Cluster) -> None:
    # The analyzer's operator set the pool range to 30-90 %: 85 % is not above it, whatever
    # the executor's own environment says.
    await five_at_85(cluster)
    wide = Ranges(pool=Band(low_enter=30.0, low_exit=35.0, high_exit=85.0, high_enter=90.0))
    above = task(AddCapacity(pool="default"), guard="pool_above_range", ranges=wide)
    assert await centre(cluster, NoneProvider()).check_guard(above, above.steps[0]) == (
        False, "pool default at 85.0% (5 nodes up) not above 90%")
    below = task(RemoveCapacity(pool="default"), guard="pool_below_range", ranges=wide)
    assert (await centre(cluster, NoneProvider()).check_guard(below, below.steps[0]))[1] == (
        "pool default at 85.0% (5 nodes up) not below 30%")


async def test_a_leaving_node_brings_its_jobs_into_the_pool_guard(cluster: Cluster) -> None:
    for i in range(1, 4):
        await cluster.node(f"node-{i}", 70.0, jobs=1)
    await cluster.node("node-4", 70.0, jobs=2, mode="offline")
    offline = task(AddCapacity(pool="default"), target="node-4", guard="pool_above_range",
                   need_kind="offline")
    holds, reason = await centre(cluster, NoneProvider()).check_guard(offline, offline.steps[0])
    # 3 x 280 + 280 GPU-percent on 12 GPUs: 93 %.
    assert holds is True
    assert "with the jobs of node-4" in reason


# ---------------------------------------------------------------- add capacity


async def test_add_capacity_acquires_what_the_plan_says_once_per_command(
    cluster: Cluster,
) -> None:
    await five_at_85(cluster)
    provider = FakeProvider(cluster, [NodeOffer("standby-1", 4), NodeOffer("standby-2", 4)])
    run = centre(cluster, provider, target_util_pct=70.0, ready_timeout_s=5.0)
    parent, command = task(AddCapacity(pool="default")), uuid4()
    result = await run.run(parent, 0, command, False)
    assert isinstance(result, Completed)
    assert provider.calls == [("acquire", "default", ("standby-1",), str(command))]
    outputs = result.outputs
    assert (outputs["initial_nodes"], outputs["initial_util_pct"]) == (5, 85.0)
    assert (outputs["target_nodes"], outputs["target_util_pct"]) == (6, 70.8)
    assert (outputs["added"], outputs["added_nodes"], outputs["ready"]) == (1, "standby-1", True)
    assert outputs["reason"] == ("5 nodes at 85% -> add 1 node (4 GPUs, pool average 4) -> "
                                 "6 nodes at about 71%")
    # A re-run of the same command (after a crash) repeats nothing and answers the same.
    assert await run.run(parent, 0, command, False) == result
    assert len(provider.calls) == 1


async def test_add_capacity_in_dry_run_calls_nothing(cluster: Cluster) -> None:
    await five_at_85(cluster)
    provider = FakeProvider(cluster, [NodeOffer("standby-1", 8)])
    result = await centre(cluster, provider).run(
        task(AddCapacity(pool="default"), dry_run=True), 0, uuid4(), True)
    assert isinstance(result, Completed)
    assert provider.calls == []
    assert result.outputs["dry_run"] is True
    assert (result.outputs["added"], result.outputs["would_add"]) == (0, "standby-1")


async def test_no_standby_capacity_completes_with_nothing_added(cluster: Cluster) -> None:
    await five_at_85(cluster)
    result = await centre(cluster, NoneProvider()).run(
        task(AddCapacity(pool="default")), 0, uuid4(), False)
    assert result == Completed({
        "direction": "out", "initial_nodes": 5, "initial_gpus": 20, "initial_util_pct": 85.0,
        "target_nodes": 5, "target_gpus": 20, "target_util_pct": 85.0, "nodes": "",
        "reason": "5 nodes at 85%: no standby capacity", "provider": "none", "added": 0,
    })


async def test_a_provider_failure_is_worth_a_retry(cluster: Cluster) -> None:
    await five_at_85(cluster)
    result = await centre(cluster, FakeProvider(cluster, [], fail=True)).run(
        task(AddCapacity(pool="default")), 0, uuid4(), False)
    assert isinstance(result, Failed)
    assert not result.permanent
    assert result.reason.startswith("provider_error: standby")


# ---------------------------------------------------------------- migrations


async def test_a_rebalance_waits_for_one_child_per_job_built_deterministically(
    cluster: Cluster, redis: Redis, keys: Keys
) -> None:
    await cluster.node("hot", 95.0, jobs=3)
    await cluster.node("warm", 40.0, jobs=1)
    await cluster.node("idle", 5.0)
    await cluster.node("drained", 0.0, mode="draining")
    parent = task(AddCapacity(pool="default"), MigrateJobs(pool="default"))
    run, command = centre(cluster, NoneProvider()), uuid4()
    result = await run.run(parent, 1, command, False)
    assert isinstance(result, Waiting)
    assert result.outputs["moves"] == "hot-j0:hot>idle"
    [child] = result.children
    assert child.task_id == child_task_id(parent, 1, command, "migrate", "hot-j0")
    assert child.parent_task_id == parent.task_id
    assert (child.need_id, child.need_kind, child.cluster_id, child.pool) == (
        NEED, "scale_out", CLUSTER, "default")
    assert (child.template, child.action_type, child.kind, child.priority) == (
        "scale_out.migrate", "migrate", "migrate", 4)
    assert child.mutex_keys == [f"job.{CLUSTER}.hot-j0", f"node.{CLUSTER}.idle"]
    assert [s.action for s in child.steps] == [
        MigrateJob(node_id="hot", job_id="hot-j0", to_node_id="idle", checkpoint_timeout_s=20.0),
        StartJob(node_id="idle", job_id="hot-j0", kind="training", checkpoint="hot-j0"),
    ]
    assert child.evidence == parent.evidence
    # Planned again from scratch (the kept result gone), the same child comes out.
    await redis.delete(f"{keys.prefix}centre-result:{command}")
    again = await run.run(parent, 1, command, False)
    assert isinstance(again, Waiting)
    assert again.children == result.children


async def test_a_rebalance_plans_on_the_task_node_range_and_children_carry_it(
    cluster: Cluster,
) -> None:
    # Under the default node range (20-80 %) `hot` at 85 % is out; under the need's 10-90 %
    # nothing is, so nothing moves.
    await cluster.node("hot", 85.0, jobs=3)
    await cluster.node("idle", 15.0)
    wide = Ranges(node=Band(low_enter=10.0, low_exit=15.0, high_exit=85.0, high_enter=90.0))
    run = centre(cluster, NoneProvider())
    kept = await run.run(task(MigrateJobs(pool="default"), ranges=wide), 0, uuid4(), False)
    assert isinstance(kept, Completed)
    assert kept.outputs["moved"] == 0
    parent = task(MigrateJobs(pool="default"), ranges=Ranges())
    moved = await run.run(parent, 0, uuid4(), False)
    assert isinstance(moved, Waiting)
    assert {child.ranges for child in moved.children} == {Ranges()}


async def test_a_leaving_node_moves_every_job_or_waits_for_a_destination(
    cluster: Cluster,
) -> None:
    await cluster.node("leaving", 60.0, jobs=3, mode="offline")
    parent = task(MigrateJobs(pool="default", node_id="leaving"), target="leaving",
                  need_kind="offline")
    nowhere = await centre(cluster, NoneProvider()).run(parent, 0, uuid4(), False)
    assert isinstance(nowhere, Failed)
    assert not nowhere.permanent
    assert nowhere.reason.startswith("no_destination")
    await cluster.node("a", 20.0)
    await cluster.node("b", 30.0)
    result = await centre(cluster, NoneProvider()).run(parent, 0, uuid4(), False)
    assert isinstance(result, Waiting)
    assert sorted(c.target for c in result.children) == ["leaving-j0", "leaving-j1",
                                                         "leaving-j2"]
    assert {c.steps[1].action.node_id for c in result.children} <= {"a", "b"}  # type: ignore[union-attr]


async def test_nothing_to_move_completes_at_once(cluster: Cluster) -> None:
    await cluster.node("a", 50.0, jobs=1)
    await cluster.node("b", 60.0, jobs=1)
    result = await centre(cluster, NoneProvider()).run(
        task(MigrateJobs(pool="default")), 0, uuid4(), False)
    assert isinstance(result, Completed)
    assert result.outputs["moved"] == 0


async def test_migration_dry_run_says_what_would_move(cluster: Cluster) -> None:
    await cluster.node("hot", 95.0, jobs=3)
    await cluster.node("idle", 5.0)
    result = await centre(cluster, NoneProvider()).run(
        task(MigrateJobs(pool="default"), dry_run=True), 0, uuid4(), True)
    assert isinstance(result, Completed)
    assert (result.outputs["dry_run"], result.outputs["moved"]) == (True, 0)
    assert result.outputs["moves"] == "hot-j0:hot>idle"


# ---------------------------------------------------------------- removing capacity


async def test_remove_capacity_waits_for_one_child_per_node(cluster: Cluster) -> None:
    for name in ("node-1", "node-2", "standby-1"):
        await cluster.node(name, 10.0, jobs=1)
    await cluster.node("node-3", 10.0, jobs=0)
    provider = FakeProvider(cluster, [], owned=["standby-1"])
    parent, command = task(RemoveCapacity(pool="default"), need_kind="scale_in"), uuid4()
    result = await centre(cluster, provider).run(parent, 0, command, False)
    assert isinstance(result, Waiting)
    # 160 GPU-percent: one node at 40 % is nearest the middle of 20-80 %.
    assert [c.target for c in result.children] == ["standby-1", "node-3", "node-1"]
    assert (result.outputs["initial_nodes"], result.outputs["target_nodes"]) == (4, 1)
    child = result.children[0]
    assert child.task_id == child_task_id(parent, 0, command, "remove", "standby-1")
    assert (child.action_type, child.template, child.mutex_keys) == (
        "remove_node", "scale_out.remove", [f"node.{CLUSTER}.standby-1"])
    assert [s.action for s in child.steps] == [
        DrainNode(node_id="standby-1"),
        MigrateJobs(pool="default", node_id="standby-1", max_jobs=64),
        ReleaseNode(node_id="standby-1"),
    ]
    assert child.steps[1].guard == "node_has_jobs"
    assert provider.calls == []


async def test_remove_capacity_never_removes_the_node_its_task_is_about(
    cluster: Cluster,
) -> None:
    for name in ("node-1", "node-2", "node-3"):
        await cluster.node(name, 5.0, jobs=1)
    await cluster.node("back", 0.0)  # just brought back online: the fewest jobs of all
    online = task(RemoveCapacity(pool="default"), target="back", need_kind="online")
    result = await centre(cluster, NoneProvider()).run(online, 0, uuid4(), False)
    assert isinstance(result, Waiting)
    assert "back" not in [c.target for c in result.children]


async def test_release_only_an_emptied_drained_node(cluster: Cluster) -> None:
    provider = FakeProvider(cluster, [], owned=["standby-1"])
    run = centre(cluster, provider)
    await cluster.node("standby-1", 30.0, jobs=1, mode="draining")
    busy = await run.run(task(ReleaseNode(node_id="standby-1")), 0, uuid4(), False)
    assert isinstance(busy, Failed)
    assert busy.reason.startswith("node_has_jobs")
    await cluster.node("standby-1", 0.0, jobs=0)
    active = await run.run(task(ReleaseNode(node_id="standby-1")), 0, uuid4(), False)
    assert isinstance(active, Failed)
    assert active.reason.startswith("node_not_drained")
    await cluster.node("standby-1", 0.0, jobs=0, mode="draining")
    dry = await run.run(task(ReleaseNode(node_id="standby-1")), 0, uuid4(), True)
    assert dry == Completed({"dry_run": True, "released": False, "would_release": "standby-1"})
    assert provider.calls == []
    command = uuid4()
    done = await run.run(task(ReleaseNode(node_id="standby-1")), 0, command, False)
    assert isinstance(done, Completed)
    assert done.outputs["released"] is True
    assert provider.calls == [("release", "standby-1", str(command))]


async def test_a_node_is_not_released_while_it_owns_stopped_jobs(cluster: Cluster) -> None:
    # A drain stops serving jobs; they still belong to the node until they are moved out, and
    # releasing it then would lose them.
    provider = FakeProvider(cluster, [], owned=["standby-1"])
    await cluster.node("standby-1", 0.0, jobs=2, mode="draining", job_state="stopped")
    result = await centre(cluster, provider).run(
        task(ReleaseNode(node_id="standby-1")), 0, uuid4(), False)
    assert isinstance(result, Failed)
    assert result.reason.startswith("node_has_jobs")
    assert not result.permanent
    assert provider.calls == []


async def test_a_task_taking_its_node_out_evacuates_it_despite_a_stale_active_report(
    cluster: Cluster,
) -> None:
    # Right after the drain step the collector may still hold the node's last report (active):
    # the offline task must still move every job off its own node, not rebalance from it.
    await cluster.node("leaving", 30.0, jobs=2)
    await cluster.node("a", 40.0)
    parent = task(MigrateJobs(pool="default", node_id="leaving"), target="leaving",
                  need_kind="offline")
    result = await centre(cluster, NoneProvider()).run(parent, 0, uuid4(), False)
    assert isinstance(result, Waiting)
    assert sorted(c.target for c in result.children) == ["leaving-j0", "leaving-j1"]
    # Sibling moves out of one node run side by side: each locks only its job and its
    # destination (agents fence job commands per job).
    for child in result.children:
        assert child.mutex_keys == [f"job.{CLUSTER}.{child.target}", f"node.{CLUSTER}.a"]


async def test_an_agent_action_is_not_a_centre_action(cluster: Cluster) -> None:
    result = await centre(cluster, NoneProvider()).run(
        task(DrainNode(node_id="n1")), 0, uuid4(), False)
    assert result == Failed("not_supported: drain_node is not a centre action", permanent=True)


async def test_build_centre_wires_the_named_provider_and_the_signers_keys(
    redis: Redis, keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPACITY_PROVIDER", "local")
    monkeypatch.setenv("CAPACITY_LOCAL_STANDBY", "standby-1:8")
    built = build_centre(ExecutorSettings(state_dir=str(tmp_path)), redis, keys)
    assert isinstance(built.provider, LocalProvider)
    assert built.provider.standby_nodes == {"standby-1": 8}
    assert sorted(p.name for p in built.provider.trusted_keys) == [
        "collector.pub", "executor.pub", "router.pub"]
    monkeypatch.setenv("CAPACITY_PROVIDER", "none")
    assert isinstance(build_centre(ExecutorSettings(state_dir=str(tmp_path)), redis, keys)
                      .provider, NoneProvider)


# ---------------------------------------------------------------- restarting an agent


async def silent(cluster: Cluster, node: str) -> None:
    """A node that reported once, then went quiet (its state as the heartbeat sweep leaves
    a node whose peers still reach it)."""
    await cluster.node(node, 10.0)
    await cluster.redis.hset(cluster.keys.node(CLUSTER, node), "state", "suspect")


async def test_restart_agent_completes_when_the_node_reports_again(cluster: Cluster) -> None:
    await silent(cluster, "node-1")
    fake = FakeProvider(cluster, [])
    run = centre(cluster, fake, restart_timeout_s=5.0)
    job = task(RestartAgent(node_id="node-1"), target="node-1", need_kind="restart_agent")
    command = uuid4()
    result = await run.run(job, 0, command, dry_run=False)
    assert isinstance(result, Completed), result
    assert result.outputs["restarted"] is True
    assert fake.calls == [("restart_agent", "node-1", str(command))]
    # Once per command: a re-run answers from the record and restarts nothing.
    assert await run.run(job, 0, command, dry_run=False) == result
    assert len(fake.calls) == 1
    # A node that reports again by itself needs no restart.
    again = await run.run(job, 0, uuid4(), dry_run=False)
    assert isinstance(again, Completed)
    assert again.outputs["restarted"] is False
    assert len(fake.calls) == 1


async def test_restart_agent_that_never_reports_is_worth_a_retry(cluster: Cluster) -> None:
    await silent(cluster, "node-1")
    fake = FakeProvider(cluster, [], fail=True)  # restarted, but it never reports
    result = await centre(cluster, fake, restart_timeout_s=0.2).run(
        task(RestartAgent(node_id="node-1"), target="node-1"), 0, uuid4(), dry_run=False)
    assert isinstance(result, Failed)
    assert not result.permanent
    assert result.reason.startswith("agent_not_reporting")


async def test_restart_agent_where_the_provider_cannot_is_a_permanent_failure(
    cluster: Cluster,
) -> None:
    await silent(cluster, "node-1")
    job = task(RestartAgent(node_id="node-1"), target="node-1")
    result = await centre(cluster, NoneProvider()).run(job, 0, uuid4(), dry_run=False)
    assert isinstance(result, Failed)
    assert result.permanent
    assert result.reason.startswith("not_supported: the none capacity provider cannot")
    dry = await centre(cluster, NoneProvider()).run(job, 0, uuid4(), dry_run=True)
    assert isinstance(dry, Completed)
    assert dry.outputs["would_restart"] == "node-1"

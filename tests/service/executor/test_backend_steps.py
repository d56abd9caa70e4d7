"""The executor's seam to a cluster's backend, on the real Redis: a cluster registered with
the `kubernetes` backend has its node steps carried out through the backend (no agent command
is sent), each call naming the task and step; a refusal fails the task at once, an unreachable
API server fails the attempt and the retry goes through; a dry-run task asks for dry runs; a
cluster with no backend named still commands its agents. The real API server's side is in
tests/integration/test_kubernetes_remediation.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from schemas.events.v1 import (
    AddCapacity,
    DrainNode,
    HealthCheck,
    OfflineNode,
    OnlineNode,
    RemoveCapacity,
    TaintEffect,
)
from services.backends.base import (
    Backend,
    BackendError,
    CapacityResult,
    DrainResult,
    Inventory,
    NodeGpus,
    NodeResult,
    Outcome,
    PodMove,
    PoolDemand,
    StepRef,
)
from services.executor.backend_steps import ClusterBackends
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys
from services.shared.registry import ClusterBackend, registered_nodes, set_cluster_backend
from tests.service.executor.test_handlers import CLUSTER, NODE, Harness, make_harness, make_task

KUBE = ClusterBackend(kind="kubernetes", kubeconfig="/nowhere/kubeconfig",
                      evictions_per_s=2.0, eviction_burst=1)


@dataclass
class RecordingBackend:
    """A backend that records each call and answers what the test set."""

    calls: list[tuple[str, str, StepRef, bool]] = field(default_factory=list)
    offline: list[NodeResult | Exception] = field(default_factory=list)
    draining: int = 0
    """How many remove_capacity calls answer a node still draining."""
    effects: list[TaintEffect] = field(default_factory=list)
    conditions: list[dict[str, str]] = field(default_factory=list)
    """NODE's conditions, one per inventory read (the last one stays); none: NODE unknown."""

    async def offline_node(self, node: str, step: StepRef, reason: str, *,
                           effect: TaintEffect = "NoSchedule",
                           dry_run: bool = False) -> NodeResult:
        self.calls.append(("offline", node, step, dry_run))
        self.effects.append(effect)
        answer = self.offline.pop(0) if self.offline else NodeResult(node, Outcome.APPLIED)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def online_node(self, node: str, step: StepRef, *,
                          dry_run: bool = False) -> NodeResult:
        self.calls.append(("online", node, step, dry_run))
        return NodeResult(node, Outcome.DRY_RUN if dry_run else Outcome.APPLIED)

    async def drain_node(self, node: str, step: StepRef, *, timeout_s: float,
                         reason: str = "drain", dry_run: bool = False) -> DrainResult:
        self.calls.append(("drain", node, step, dry_run))
        return DrainResult(node, moved=(PodMove("ml", "train-0", node, "train-0", "gpu-2"),),
                           dry_run=dry_run)

    async def add_capacity(self, pool: str, count: int, step: StepRef, *,
                           timeout_s: float = 60.0, dry_run: bool = False) -> CapacityResult:
        self.calls.append(("add_capacity", f"{pool}:{count}", step, dry_run))
        return CapacityResult(pool, ("standby-1",),
                              Outcome.DRY_RUN if dry_run else Outcome.APPLIED)

    async def remove_capacity(self, pool: str, nodes: tuple[str, ...], step: StepRef, *,
                              count: int = 0, timeout_s: float = 60.0,
                              dry_run: bool = False) -> CapacityResult:
        self.calls.append(("remove_capacity", f"{pool}:{count}", step, dry_run))
        if self.draining:
            self.draining -= 1
            return CapacityResult(pool, (), Outcome.APPLIED, held=("standby-1",),
                                  detail="1 node(s) still draining: standby-1")
        return CapacityResult(pool, ("standby-1",), Outcome.APPLIED)

    async def inventory(self) -> Inventory:
        nodes = [NodeGpus("gpu-2", 8, 8, schedulable=True, ready=True)]
        if self.conditions:
            conditions = self.conditions.pop(0) if len(self.conditions) > 1 else self.conditions[0]
            nodes.append(NodeGpus(NODE, 8, 8, schedulable=False,
                                  ready=conditions.get("Ready") == "True",
                                  conditions=conditions))
        return Inventory(nodes=tuple(nodes), pods_by_node={}, pending=())

    async def queued_demand(self, default_pool: str) -> tuple[PoolDemand, ...]:
        return ()


@dataclass
class FakeTime:
    """The executor's clock for a step that waits: each sleep moves it on at once."""

    now: float = 1_800_000_000.0
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def kube_harness(redis: Redis, keys: Keys, tmp_path: Path, backend: RecordingBackend,
                       clock: FakeTime | None = None) -> tuple[Harness, list[ClusterBackend]]:
    opened: list[ClusterBackend] = []

    async def opener(config: ClusterBackend) -> Backend:
        opened.append(config)
        return backend

    await set_cluster_backend(redis, keys, CLUSTER, KUBE)
    time = clock or FakeTime()
    harness = make_harness(redis, keys, tmp_path, ExecutorSettings(backoff_base_s=1.0),
                           ClusterBackends(redis, keys, openers={"kubernetes": opener},
                                           clock=time, sleep=time.sleep))
    return harness, opened


async def test_a_kubernetes_clusters_node_steps_go_through_its_backend_not_to_an_agent(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, opened = await kube_harness(redis, keys, tmp_path, backend)
    task = make_task(DrainNode(node_id=NODE), OfflineNode(node_id=NODE))
    await harness.dispatch(task)
    assert harness.commands() == []
    assert [(c[0], c[1], c[2].task_id, c[2].step, c[3]) for c in backend.calls] == [
        ("drain", NODE, str(task.task_id), "0:s0", False),
        ("offline", NODE, str(task.task_id), "1:s1", False)]
    assert harness.states(task)[-1] == "succeeded"
    drained = harness.events(task)[2]
    assert drained.step_state == "completed"
    assert drained.outputs["moves"] == "ml/train-0->gpu-2"
    assert drained.outputs["gpus_schedulable_before"] == 8
    # One backend per cluster, opened with the registered access and eviction budget.
    assert opened == [KUBE]
    assert await harness.lock_owner(f"node.{NODE}") is None


class MeetingBackend(RecordingBackend):
    """Each drain waits until the other drain has started too: two drains run one after the
    other never meet, and the first gives up."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0
        self.both = asyncio.Event()

    async def drain_node(self, node: str, step: StepRef, *, timeout_s: float,
                         reason: str = "drain", dry_run: bool = False) -> DrainResult:
        self.entered += 1
        if self.entered == 2:
            self.both.set()
        await asyncio.wait_for(self.both.wait(), 5.0)
        return await super().drain_node(node, step, timeout_s=timeout_s, reason=reason,
                                        dry_run=dry_run)


async def test_drains_of_two_tasks_run_side_by_side_and_do_not_hold_the_consumer(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = MeetingBackend()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    first = make_task(DrainNode(node_id=NODE), OfflineNode(node_id=NODE))
    second = make_task(DrainNode(node_id="n2"), OfflineNode(node_id="n2"), mutex=["node.n2"])
    # The consumer hands over the first task and is free for the second while its drain runs.
    await harness.schedule(first)
    await harness.schedule(second)
    await harness.executor.idle()
    assert backend.entered == 2
    assert harness.states(first)[-1] == "succeeded", harness.events(first)
    assert harness.states(second)[-1] == "succeeded", harness.events(second)


async def test_a_refusal_ends_the_task_at_once_and_an_unreachable_server_is_retried(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend(offline=[
        NodeResult(NODE, Outcome.REFUSED, "cordoned by someone else (no ClusterWarden claim)")])
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    refused = make_task(OfflineNode(node_id=NODE))
    await harness.dispatch(refused)
    final = harness.final(refused)
    assert final.state == "failed"
    assert "refused: offline of n1: cordoned by someone else" in final.reason
    assert len(backend.calls) == 1  # permanent: no second attempt

    backend.offline = [BackendError("patch node n1: the API server could not be reached")]
    flaky = make_task(OfflineNode(node_id=NODE))
    await harness.dispatch(flaky)
    failed = harness.events(flaky)[-1]
    assert failed.step_state == "failed"
    assert "backend_unreachable" in failed.reason
    assert "retry in 1 s" in failed.reason
    await harness.retry_now(flaky)
    assert harness.final(flaky).state == "succeeded"
    assert [c[2].task_id for c in backend.calls[1:]] == [str(flaky.task_id)] * 2
    assert harness.commands() == []


async def test_a_dry_run_task_asks_the_backend_for_dry_runs_only(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    task = make_task(OnlineNode(node_id=NODE)).model_copy(update={"dry_run": True})
    await harness.dispatch(task)
    assert backend.calls[0][0] == "online"
    assert backend.calls[0][3] is True
    assert harness.events(task)[2].outputs["dry_run"] is True
    assert harness.final(task).state == "succeeded"


async def test_a_cluster_with_no_backend_named_still_commands_its_agents(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    await redis.delete(keys.cluster_backend(CLUSTER))
    task = make_task(OfflineNode(node_id=NODE))
    await harness.dispatch(task)
    assert backend.calls == []
    assert harness.last_command().action.action == "offline_node"


async def test_capacity_steps_go_through_the_backend_and_enrol_what_it_added(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend(draining=1)
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    grow = make_task(AddCapacity(pool="default"))
    await harness.dispatch(grow)
    assert harness.commands() == []
    assert [(c[0], c[1], c[2].step) for c in backend.calls] == [
        ("add_capacity", "default:0", "0:s0")]
    added = harness.events(grow)[2].outputs
    assert (added["added"], added["added_nodes"], added["outcome"]) == (1, "standby-1",
                                                                       "applied")
    assert harness.final(grow).state == "succeeded"
    assert "standby-1" in await registered_nodes(redis, keys, CLUSTER)

    # A node still draining when the step's time ran out: failed, retried; then given back.
    shrink = make_task(RemoveCapacity(pool="default", nodes=1))
    await harness.dispatch(shrink)
    failed = harness.events(shrink)[-1]
    assert failed.step_state == "failed"
    assert "capacity_incomplete" in failed.reason
    assert "standby-1" in failed.reason
    await harness.retry_now(shrink)
    assert harness.final(shrink).state == "succeeded"
    assert [c[1] for c in backend.calls[1:]] == ["default:1", "default:1"]
    assert "standby-1" not in await registered_nodes(redis, keys, CLUSTER)


async def test_a_dry_run_capacity_step_says_what_it_would_add_and_enrols_nothing(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    task = make_task(AddCapacity(pool="default", nodes=2)).model_copy(update={"dry_run": True})
    await harness.dispatch(task)
    assert backend.calls[0][1:] == ("default:2", backend.calls[0][2], True)
    outputs = harness.events(task)[2].outputs
    assert (outputs["dry_run"], outputs["added"], outputs["would_add"]) == (
        True, 0, "standby-1")
    assert "standby-1" not in await registered_nodes(redis, keys, CLUSTER)


async def test_the_offline_steps_taint_effect_reaches_the_backend(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend)
    task = make_task(OfflineNode(node_id=NODE, effect="NoExecute"), OfflineNode(node_id=NODE))
    await harness.dispatch(task)
    assert harness.final(task).state == "succeeded"
    assert backend.effects == ["NoExecute", "NoSchedule"]


async def test_online_waits_for_the_health_check_then_brings_the_node_back(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    problem = {"Ready": "True", "GPUProblem": "True"}
    backend = RecordingBackend(conditions=[problem, problem, {"Ready": "True"}])
    clock = FakeTime()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend, clock)
    # The agent's last fault, as the collector keeps it: 100 s ago, within no 30 s hold.
    await redis.hset(keys.node(CLUSTER, NODE), mapping={
        "state": "offline", "fault_count": 0, "fault_at": clock.now - 100.0})
    task = make_task(OnlineNode(node_id=NODE, health_check=HealthCheck(hold_s=30)))
    await harness.dispatch(task)
    assert harness.final(task).state == "succeeded"
    # Not uncordoned while the condition was True: asked twice, then online once.
    assert [c[0] for c in backend.calls] == ["online"]
    assert len(clock.slept) == 2
    outputs = harness.events(task)[2].outputs
    assert (outputs["outcome"], outputs["health"]) == ("applied", "clear")


async def test_online_whose_node_stays_unhealthy_fails_retryably_and_never_uncordons(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend(conditions=[{"Ready": "True"}])
    clock = FakeTime()
    harness, _ = await kube_harness(redis, keys, tmp_path, backend, clock)
    # The conditions are clear, but the agent faulted 5 s ago: the 60 s hold is not over
    # within the step's 30 s.
    await redis.hset(keys.node(CLUSTER, NODE), mapping={
        "state": "offline", "fault_count": 0, "fault_at": clock.now - 5.0})
    task = make_task(OnlineNode(node_id=NODE, health_check=HealthCheck(hold_s=60)))
    await harness.dispatch(task)
    failed = harness.events(task)[-1]
    assert failed.step_state == "failed"
    assert f"health_check: {NODE} not healthy" in failed.reason
    assert "its agent's last fault was" in failed.reason
    assert "retry in 1 s" in failed.reason
    assert backend.calls == []


async def test_the_backends_of_registered_clusters_are_opened_before_any_step_needs_them(
    redis: Redis, keys: Keys, tmp_path: Path,
) -> None:
    backend = RecordingBackend()
    harness, opened = await kube_harness(redis, keys, tmp_path, backend)
    await set_cluster_backend(redis, keys, "gone-local", KUBE)
    await set_cluster_backend(redis, keys, "gone-local", ClusterBackend())  # back to local
    backends = harness.executor.workflow.backends
    assert isinstance(backends, ClusterBackends)
    await backends.warm()
    assert opened == [KUBE]  # the Kubernetes cluster's, not the one back to local agents
    assert backends.opened.clusters() == [CLUSTER]
    await backends.warm()  # already open: nothing opened again
    assert opened == [KUBE]

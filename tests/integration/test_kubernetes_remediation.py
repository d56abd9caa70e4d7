"""Remediation of a Kubernetes cluster end to end, on the real API server (kwok nodes, the real
scheduler, controllers, PDBs and Eviction API), Kafka, Redis and every service as a process.

The cluster is registered with the `kubernetes` backend; each kwok node has an agent process
whose jobs are the GPU pods the API server bound to its node (AGENT_JOBS=kube). A fatal XID on
a node's agent raises the offline need; the executor carries the task's steps out through the
backend: the node is cordoned, tainted and claimed, its GPU pods are evicted (a PDB holds them
until it is lowered), and their StatefulSet's replacements run on healthy nodes. The repaired
node comes back through an online task. A node a person cordoned is never drained; a dry run
changes nothing on the API server.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import OpsTask, TaskEvent
from schemas.kubernetes import OFFLINE_ANNOTATION, TAINT_KEY
from schemas.topics import Topic
from services.backends.kubernetes.connection import KubeAccess
from services.shared.registry import CapacityKind, ClusterBackend, name_backend, register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    is_up,
    name,
    services,
    stack_env,
    tap,
)
from tests.kube import ROOT as REPO_ROOT
from tests.kube import KubeScope, settled

CLUSTER = "itest"
# Every node's GPUs held at half load: the pool stays inside its range whatever is offline,
# so the capacity steps' guards do not hold (capacity is tests/integration/
# test_kubernetes_capacity.py's).
LOAD_PCT = 50.0
TASK_TIMEOUT_S = 180.0


def kube_env(kafka_bootstrap: str, redis_url: str, namespace: str, state: Path,
             kubeconfig: str, *, needs: str = '["offline", "online"]',
             **extra: str) -> dict[str, str]:
    return stack_env(
        kafka_bootstrap, redis_url, namespace, state, WARDEN_LOG_LEVEL="INFO",
        ANALYZER_ENABLED_NEEDS=needs, ANALYZER_ONLINE__HOLD_S="3",
        AGENT_KUBECONFIG=kubeconfig, **SMALL_POOL_SAFETY, **extra)


async def register_kube_cluster(env: dict[str, str], kube_api: KubeAccess, nodes: list[str], *,
                                cluster: str = CLUSTER, capacity: CapacityKind = "standby",
                                capacity_namespace: str = "default") -> None:
    """`cluster` registered with the kubernetes backend (the admin kubeconfig), its nodes
    enrolled."""
    assert kube_api.kubeconfig is not None
    await name_backend(env["REDIS_URL"], env["WARDEN_NAMESPACE"], cluster, ClusterBackend(
        kind="kubernetes", kubeconfig=kube_api.kubeconfig, evictions_per_s=5.0,
        eviction_burst=2, capacity=capacity, capacity_namespace=capacity_namespace))
    await register(env["REDIS_URL"], env["WARDEN_NAMESPACE"], cluster, nodes)


def start_kube_agents(env: dict[str, str], state: Path, nodes: list[str], trusted: list[Path], *,
                      cluster: str = CLUSTER, load_pct: float = LOAD_PCT) -> None:
    """An agent process per kwok node (its fleet in `state`) whose jobs are the pods the API
    server bound to its node, its GPUs held at `load_pct`."""
    for node in nodes:
        fleet.inject_fault(state, node, load_pct=load_pct)
        fleet.start_agent(node, gpus=8, cluster_id=cluster, namespace=env["WARDEN_NAMESPACE"],
                          state_dir=state, env=env, trusted_keys=trusted, interval_s=1.0,
                          jobs="kube")


@asynccontextmanager
async def kube_cluster(env: dict[str, str], state: Path, kube_api: KubeAccess,
                       nodes: list[str], *, load_pct: float = LOAD_PCT,
                       capacity: CapacityKind = "standby",
                       capacity_namespace: str = "default",
                       topics: tuple[Topic, ...] = ()) -> AsyncIterator[Tap]:
    """The services, cluster `itest` registered with the kubernetes backend, an agent per
    kwok node reading that node's pods, and a tap on task events and node states (and
    `topics`)."""
    trusted = ensure_signer_keys(state / "keys")
    namespace = env["WARDEN_NAMESPACE"]
    await register_kube_cluster(env, kube_api, nodes, capacity=capacity,
                                capacity_namespace=capacity_namespace)
    async with services(env, state):
        try:
            start_kube_agents(env, state, nodes, trusted, load_pct=load_pct)
            async with tap(env["KAFKA_BOOTSTRAP_SERVERS"],
                           name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           *(name(t, namespace) for t in topics)) as watch:
                for node in nodes:
                    await watch.wait_for(is_up(node), 60, f"{node} up")
                yield watch
        finally:
            fleet.fleet_down(state)


def task_events(watch: Tap, target: str, need_kind: str) -> list[TaskEvent]:
    """The events of the top-level `need_kind` tasks aimed at `target`, in order."""
    parsed = [TaskEvent.model_validate_json(r.value) for r in watch.records
              if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]
    ids = {e.task_id for e in parsed if e.task is not None and e.task.target == target
           and e.task.need_kind == need_kind and e.task.parent_task_id is None}
    return [e for e in parsed if e.task_id in ids]


def finished(watch: Tap, target: str, need_kind: str) -> bool:
    return any(e.state in ("succeeded", "failed", "terminated") and e.step_state is None
               for e in task_events(watch, target, need_kind))


def ended(watch: Tap, target: str, need_kind: str) -> Callable[[Record], bool]:
    return lambda _: finished(watch, target, need_kind)


def final(events: list[TaskEvent]) -> TaskEvent:
    return [e for e in events if e.step_state is None
            and e.state in ("succeeded", "failed", "terminated")][-1]


def step_outputs(events: list[TaskEvent], action: str) -> dict[str, object]:
    """The outputs of the completed step of `action` (the first)."""
    plans = {e.task_id: e.task for e in events if e.task is not None}
    for event in events:
        plan = plans.get(event.task_id)
        if (plan is not None and event.step_state == "completed"
                and event.step_index is not None
                and plan.steps[event.step_index].action.action == action):
            return dict(event.outputs)
    raise AssertionError(f"no completed {action} step: {[e.reason for e in events]}")


def story(events: list[TaskEvent]) -> list[str]:
    return [f"{e.state} {e.step_index} {e.step_state} {e.reason} {dict(e.outputs)}"
            for e in events]


async def task_ended(watch: Tap, target: str, need_kind: str,
                    state: str) -> tuple[list[TaskEvent], OpsTask]:
    """Waits for the `need_kind` task of `target` to end in `state`: its events and plan."""
    await watch.wait_for(ended(watch, target, need_kind), TASK_TIMEOUT_S,
                         f"the {need_kind} task of {target} to end")
    events = task_events(watch, target, need_kind)
    assert final(events).state == state, story(events)
    plan = next(e.task for e in events if e.task is not None)
    assert plan is not None
    return events, plan


def our_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints") or () if t["key"] == TAINT_KEY]


def claim_of(node: dict[str, Any]) -> str | None:
    annotations: dict[str, str] = node["metadata"].get("annotations") or {}
    return annotations.get(OFFLINE_ANNOTATION)


async def claimed(kube: KubeScope, node: str) -> None:
    """Waits until ClusterWarden has cordoned the node and put its claim on it."""
    async def check() -> bool:
        marks = await kube.node(node)
        return bool(marks["spec"].get("unschedulable")) and claim_of(marks) is not None

    await settled(check, f"{node} cordoned and claimed by ClusterWarden", timeout_s=90.0)


async def a_bad_node_and_two_good(
        kube: KubeScope, *, min_available: int,
        names: tuple[str, str, str] | None = None) -> tuple[str, list[str]]:
    """Node `bad` with StatefulSet `train` (2 pods, 2 GPUs each) Running on it and a PDB of
    `min_available` over it, then two healthy nodes beside it. `names`: the three nodes'
    whole names (bad first) instead of the scope's prefixed ones."""
    async def node(suffix: str, index: int) -> str:
        return await kube.add_gpu_node(suffix, name=None if names is None else names[index])

    bad = await node("bad", 0)
    await kube.add_gpu_statefulset("train", 2, gpus=2)

    async def both() -> bool:
        return await kube.running_on(bad) == ["train-0", "train-1"]

    await settled(both, f"both train pods Running on {bad}")
    await kube.add_pdb("train", "train", min_available)
    return bad, [await node("good-1", 1), await node("good-2", 2)]


async def check_offline_and_drained(kube: KubeScope, bad: str, good: list[str],
                                    task_id: str) -> None:
    """`bad` cordoned, tainted NoSchedule and claimed by task `task_id`; both train pods
    moved off it, onto the `good` nodes."""
    node = await kube.node(bad)
    assert node["spec"]["unschedulable"] is True
    assert [t["effect"] for t in our_taints(node)] == ["NoSchedule"]
    assert task_id in str(claim_of(node))
    assert await kube.running_on(bad) == []
    placed = [*await kube.running_on(good[0]), *await kube.running_on(good[1])]
    assert sorted(placed) == ["train-0", "train-1"]


async def left_alone(kube: KubeScope, node: str, *, cordoned: bool) -> None:
    """The node has no mark of ClusterWarden's (taint, claim) and its pods still run there."""
    marks = await kube.node(node)
    assert bool(marks["spec"].get("unschedulable")) is cordoned
    assert our_taints(marks) == []
    assert claim_of(marks) is None
    assert await kube.running_on(node) == ["train-0", "train-1"]


async def test_a_fatal_xid_drains_and_offlines_the_node_and_its_repair_brings_it_back(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    # A PDB that allows no disruption yet: the drain must wait on it.
    bad, good = await a_bad_node_and_two_good(kube, min_available=2)
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig))
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch:
        fleet.inject_fault(tmp_path, bad, xid=[79])

        await claimed(kube, bad)
        # The PDB holds both pods: the drain waits (the task goes on), nothing is evicted.
        assert await kube.running_on(bad) == ["train-0", "train-1"]
        await watch.catch_up()
        assert not finished(watch, bad, "offline"), story(task_events(watch, bad, "offline"))
        await kube.set_pdb_min_available("train", 1)

        offline, plan = await task_ended(watch, bad, "offline", "succeeded")
        drained = step_outputs(offline, "drain_node")
        assert drained["backend"] == "kubernetes"
        assert drained["evicted"] == 2, drained
        assert int(str(drained["pdb_waits"])) >= 1, drained
        # Schedulable GPUs before and after: the bad node's 8 are out.
        assert (int(str(drained["gpus_schedulable_before"]))
                - int(str(drained["gpus_schedulable_after"]))) == 8, drained
        assert set(str(drained["replacements_on"]).split(",")) <= set(good), drained
        assert step_outputs(offline, "offline_node")["backend"] == "kubernetes"

        await check_offline_and_drained(kube, bad, good, str(plan.task_id))
        for move in str(drained["moves"]).split(","):
            pod, _, to_node = move.partition("->")
            assert pod.split("/")[1] in await kube.running_on(to_node), drained

        # Repaired: the fault cleared (the load kept), the online task brings it back.
        fleet.clear_faults(tmp_path, bad)
        fleet.inject_fault(tmp_path, bad, load_pct=LOAD_PCT)
        online, _ = await task_ended(watch, bad, "online", "succeeded")
        assert step_outputs(online, "online_node")["outcome"] == "applied"
        node = await kube.node(bad)
        assert not node["spec"].get("unschedulable")
        assert our_taints(node) == []
        assert claim_of(node) is None


async def test_a_problem_condition_on_the_node_is_fault_data_that_takes_it_offline(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_bad_node_and_two_good(kube, min_available=0)
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   AGENT_NODE_FAULT_CONDITIONS="GPUProblem,KernelDeadlock")
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch:
        # No fault in the agent's own readings: only the Node says something is wrong, as
        # a node-problem-detector would.
        await kube.set_condition(bad, "GPUProblem", "True", reason="GpuHealthCheckFailed",
                                 message="gpu 3 fell off the bus")
        offline, plan = await task_ended(watch, bad, "offline", "succeeded")
        evidence = " ".join(e.detail for e in plan.evidence)
        assert "node_condition [GPUProblem=True: GpuHealthCheckFailed" in evidence, evidence
        assert step_outputs(offline, "drain_node")["evicted"] == 2
        node = await kube.node(bad)
        assert node["spec"]["unschedulable"] is True
        assert str(plan.task_id) in str(claim_of(node))
        # The other nodes' conditions say nothing wrong: they were left alone.
        for other in good:
            assert claim_of(await kube.node(other)) is None


async def test_a_node_a_person_cordoned_is_left_as_they_left_it_and_nothing_is_evicted(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_bad_node_and_two_good(kube, min_available=0)
    # A person cordons the node (no ClusterWarden claim), then its GPU fails.
    await kube.core.patch_node(bad, {"spec": {"unschedulable": True}})
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig))
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch:
        fleet.inject_fault(tmp_path, bad, xid=[79])
        offline, _ = await task_ended(watch, bad, "offline", "failed")
        last = final(offline)
        assert "refused" in last.reason, story(offline)
        # Refused for good: one attempt of the drain step, no retry.
        failed_steps = [e for e in offline if e.step_state == "failed"
                        and e.task_id == last.task_id]
        assert len(failed_steps) == 1, story(offline)
        assert "permanent" in failed_steps[0].reason

        await left_alone(kube, bad, cordoned=True)


async def test_a_dry_run_changes_nothing_on_the_api_server(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_bad_node_and_two_good(kube, min_available=0)
    before = await kube.node(bad)
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await kube.pods()}
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   TEMPLATER_DRY_RUN="true")
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch:
        fleet.inject_fault(tmp_path, bad, xid=[79])
        offline, plan = await task_ended(watch, bad, "offline", "succeeded")
        assert plan.dry_run
        drained = step_outputs(offline, "drain_node")
        assert drained["dry_run"] is True
        assert drained["would_evict"] == 2, drained
        assert step_outputs(offline, "offline_node")["outcome"] == "dry_run"

        await left_alone(kube, bad, cordoned=False)
        node = await kube.node(bad)
        assert node["spec"].get("taints") == before["spec"].get("taints")
        assert node["metadata"].get("annotations") == before["metadata"].get("annotations")
        assert {p["metadata"]["name"]: p["metadata"]["uid"]
                for p in await kube.pods()} == pods_before


def stop_the_api_server(kube_api: KubeAccess) -> None:
    """SIGTERM the kube-apiserver of deploy/local/kubernetes.sh (etcd, the controllers and
    kwok keep running); its pid file is beside the admin kubeconfig."""
    assert kube_api.kubeconfig is not None
    pid = int((Path(kube_api.kubeconfig).parent / "kube-apiserver.pid").read_text())
    os.kill(pid, signal.SIGTERM)


def start_the_control_plane_again() -> None:
    """deploy/local/kubernetes.sh start: a half-running control plane is started whole again
    (etcd keeps its data)."""
    subprocess.run([str(REPO_ROOT / "deploy" / "local" / "kubernetes.sh"), "start"],
                   check=True, timeout=300, stdin=subprocess.DEVNULL)


async def test_the_api_server_stopping_mid_drain_fails_the_attempt_and_the_retry_drains(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    # The PDB holds the pods, so the drain is still evicting when the API server stops.
    bad, good = await a_bad_node_and_two_good(kube, min_available=2)
    # The retry comes well after the API server is back.
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   EXECUTOR_BACKOFF_BASE_S="20")
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch:
        fleet.inject_fault(tmp_path, bad, xid=[79])

        await claimed(kube, bad)
        stop_the_api_server(kube_api)

        def attempt_failed(_: Record) -> bool:
            return any(e.step_state == "failed" for e in task_events(watch, bad, "offline"))

        await watch.wait_for(attempt_failed, 60, "the drain attempt to fail")
        start_the_control_plane_again()
        await kube.set_pdb_min_available("train", 1)

        offline, _ = await task_ended(watch, bad, "offline", "succeeded")
        failed = [e for e in offline if e.step_state == "failed"]
        assert len(failed) == 1, story(offline)
        assert "backend_unreachable" in failed[0].reason, story(offline)
        assert "retry in 20 s" in failed[0].reason, story(offline)
        # The retry evicted each pod once: the failed attempt evicted none (the PDB held them).
        drained = step_outputs(offline, "drain_node")
        assert drained["evicted"] == 2, drained
        moved = sorted(m.partition("->")[0] for m in str(drained["moves"]).split(","))
        assert moved == [f"{kube.namespace}/train-0", f"{kube.namespace}/train-1"], drained
        assert await kube.running_on(bad) == []
        placed = [*await kube.running_on(good[0]), *await kube.running_on(good[1])]
        assert sorted(placed) == ["train-0", "train-1"]

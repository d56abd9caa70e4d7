"""Capacity of a Kubernetes cluster end to end (issue 14, test 3), on the real API server (kwok
nodes, the real scheduler), Kafka, Redis and every service as a process.

Two kwok nodes run a GPU StatefulSet whose third pod fits nowhere (pending), and their agents
report the pool at half load, inside its range: only the pending pod, which the inventory
service reports as queued demand (`pending_jobs`), pushes the pool's effective utilisation
over the range. The analyzer raises scale_out, and the executor's add_capacity step goes
through the cluster's backend. With the standby pool, the standby node is uncordoned (with the
task's record on it) and the pending pod is scheduled there. With a Cluster API
MachineDeployment, its replicas grow by the machines the pending GPUs need; while the machine
comes up its GPUs are on their way and come off the queued demand, so no second scale-out is
asked for the same pod; the test plays the infrastructure and creates the new Machine and its
Node, which the step waits for, names and enrols; the pod is scheduled there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from agent import fleet
from schemas.events.v1 import OpsNeed, OpsTask, PoolHealth, TaskEvent
from schemas.kubernetes import CAPACITY_ANNOTATION, STANDBY_LABEL
from schemas.topics import Topic
from services.backends.kubernetes.connection import KubeAccess
from services.shared.demand import PENDING_JOBS, DemandEntry, parse_entries
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import registered_nodes
from tests.integration.harness import Record, Tap
from tests.integration.test_kubernetes_remediation import (
    LOAD_PCT,
    TASK_TIMEOUT_S,
    final,
    kube_cluster,
    kube_env,
    step_outputs,
    story,
)
from tests.kube import SCOPE_LABEL, KubeScope, settled

POOL = "default"
# The scale need's hold: longer than the scheduler's longest backoff (10 s) for a pod it
# could not place, which the pending pod may wait out after its node arrives.
HOLD_S = 12
ENDED = ("succeeded", "failed", "terminated")
# The pool's agents report half load (LOAD_PCT): inside the range. The pending 8-GPU pod is
# 50 % of the pool's 16 GPUs up, which takes the effective utilisation to 100 %.
PENDING_DEMAND_PCT = 50.0


def env_for(kafka_bootstrap: str, redis_url: str, namespace: str, state: Path,
            kube_api: KubeAccess) -> dict[str, str]:
    return kube_env(kafka_bootstrap, redis_url, namespace, state, str(kube_api.kubeconfig),
                    needs='["scale"]', ANALYZER_SCALE__HOLD_S=str(HOLD_S),
                    # A raised need stays open (not raised again) for a few seconds only:
                    # machines that take longer than that to come up, as real ones may.
                    ANALYZER_OPEN_NEED_TTL_S="5",
                    ANALYZER_POOL_PERIOD_S="1", INVENTORY_PERIOD_S="1",
                    SCHEDULER_RATE_PER_S="10")


TOPICS = (Topic.OPS_POOL_HEALTH, Topic.OPS_NEEDS)


async def two_full_nodes_and_a_pending_pod(kube: KubeScope) -> tuple[list[str], str]:
    """Nodes `a` and `b` (8 GPUs each) and StatefulSet `train` of three 8-GPU pods: two run,
    one (whichever the scheduler left: the pods start in parallel) waits for a node."""
    nodes = [await kube.add_gpu_node("a"), await kube.add_gpu_node("b")]
    await kube.add_gpu_statefulset("train", 3, gpus=8)

    async def two_run_one_waits() -> str | None:
        pods = await kube.pods()
        running = [*await kube.running_on(nodes[0]), *await kube.running_on(nodes[1])]
        waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        return waiting[0] if len(running) == 2 and len(waiting) == 1 else None

    pending = await settled(two_run_one_waits, "two train pods Running, one pending")
    return nodes, pending


async def pod_runs_on(kube: KubeScope, pod: str, node: str) -> None:
    async def there() -> bool:
        return pod in await kube.running_on(node)

    await settled(there, f"{pod} Running on {node}", timeout_s=90.0)


def record_on(obj: dict[str, Any]) -> dict[str, Any]:
    annotations = obj["metadata"].get("annotations") or {}
    assert CAPACITY_ANNOTATION in annotations, annotations
    record: dict[str, Any] = json.loads(annotations[CAPACITY_ANNOTATION])
    return record


def scale_out_tasks(watch: Tap) -> dict[UUID, list[TaskEvent]]:
    """The events of each top-level scale_out task of the pool, by task, in order."""
    parsed = [TaskEvent.model_validate_json(r.value) for r in watch.records
              if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]
    ids = [e.task_id for e in parsed if e.task is not None and e.task.need_kind == "scale_out"
           and e.task.pool == POOL and e.task.parent_task_id is None]
    return {task_id: [e for e in parsed if e.task_id == task_id] for task_id in ids}


def scale_out_needs(watch: Tap) -> list[OpsNeed]:
    return [need for r in watch.records if r.topic.endswith(Topic.OPS_NEEDS.value)
            if (need := OpsNeed.model_validate_json(r.value)).kind == "scale_out"
            and need.target == POOL]


def healths(watch: Tap, start: int = 0) -> list[PoolHealth]:
    """The pool's health, one per analysis period, from record `start` on."""
    return [h for r in watch.records[start:] if r.topic.endswith(Topic.OPS_POOL_HEALTH.value)
            if (h := PoolHealth.model_validate_json(r.value)).pool == POOL]


async def first_scale_out(watch: Tap) -> tuple[list[TaskEvent], OpsTask]:
    """The pool's first scale_out task, once it ended (succeeded), raised by the pending
    pod's demand: the pool's own load was inside its range."""
    def first_ended(_: Record) -> bool:
        tasks = list(scale_out_tasks(watch).values())
        return bool(tasks) and any(e.step_state is None and e.state in ENDED
                                   for e in tasks[0])

    await watch.wait_for(first_ended, TASK_TIMEOUT_S, "the first scale_out task to end")
    events = next(iter(scale_out_tasks(watch).values()))
    assert final(events).state == "succeeded", story(events)
    plan = next(e.task for e in events if e.task is not None)
    assert plan is not None
    assert [s.action.action for s in plan.steps] == ["add_capacity", "migrate_jobs"]
    detail = plan.evidence[0].detail
    assert f"{PENDING_DEMAND_PCT:.1f}% demand (1 pending_jobs)" in detail, detail
    assert plan.evidence[0].value > 80.0, detail
    # The pool's own load never left the range: the queued demand raised the need.
    assert max(h.gpu_utilization_pct for h in healths(watch)) < 80.0, detail
    return events, plan


async def pending_jobs(redis_url: str, namespace: str) -> DemandEntry | None:
    """The inventory's queued demand entry for the pool."""
    redis = connect_redis(redis_url)
    try:
        raw = await redis.hgetall(Keys(namespace).demand_sources("itest", POOL))
    finally:
        await redis.aclose()
    return parse_entries(raw).get(PENDING_JOBS)


async def periods(watch: Tap, count: int, what: str, *, start: int,
                  load: Callable[[float], bool]) -> None:
    """Waits for `count` analysis periods (from record `start` on) whose pool load
    satisfies `load`; the needs of every period before the last are published by then."""
    await watch.wait_for(
        lambda _: len([h for h in healths(watch, start) if load(h.gpu_utilization_pct)])
        >= count, TASK_TIMEOUT_S, what)


async def assert_enrolled(redis_url: str, namespace: str, node: str) -> None:
    """The node is in the cluster's registry, so its agent's reports count."""
    redis = connect_redis(redis_url)
    try:
        assert node in await registered_nodes(redis, Keys(namespace), "itest")
    finally:
        await redis.aclose()


async def test_pending_gpu_pods_get_a_standby_node_uncordoned_and_run_there(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    nodes, pending = await two_full_nodes_and_a_pending_pod(kube)
    standby = await kube.add_gpu_node("standby", labels={STANDBY_LABEL: "true"},
                                      cordoned=True)
    # A standby node someone uses (not cordoned): never ClusterWarden's to take. It has no
    # room for the pending pod: the pod selects the scope's nodes, this one carries another scope.
    used = await kube.add_gpu_node("used", labels={STANDBY_LABEL: "true",
                                                   SCOPE_LABEL: f"{kube.prefix}-other"})
    env = env_for(kafka_bootstrap, redis_url, namespace, tmp_path, kube_api)
    async with kube_cluster(env, tmp_path, kube_api, nodes, topics=TOPICS) as watch:
        events, plan = await first_scale_out(watch)
        added = step_outputs(events, "add_capacity")
        assert added["backend"] == "kubernetes", added
        assert (added["added"], added["added_nodes"]) == (1, standby), added
        assert added["outcome"] == "applied", added
        assert (int(str(added["gpus_schedulable_after"]))
                - int(str(added["gpus_schedulable_before"]))) == 8, added

        node = await kube.node(standby)
        assert not node["spec"].get("unschedulable")
        record = record_on(node)
        assert (record["task_id"], record["step"], record["pool"], record["state"]) == (
            str(plan.task_id), "0:add-capacity", POOL, "added")
        await pod_runs_on(kube, pending, standby)
        await assert_enrolled(redis_url, namespace, standby)
        left = await kube.node(used)
        assert not left["spec"].get("unschedulable")
        assert CAPACITY_ANNOTATION not in (left["metadata"].get("annotations") or {})


async def test_pending_gpu_pods_grow_the_machine_deployment_once_while_the_machine_comes_up(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    nodes, pending = await two_full_nodes_and_a_pending_pod(kube)
    await kube.add_machine_deployment(POOL, replicas=2, gpus=8)
    env = env_for(kafka_bootstrap, redis_url, namespace, tmp_path, kube_api)
    async with kube_cluster(env, tmp_path, kube_api, nodes, capacity="machinedeployment",
                            capacity_namespace=kube.namespace, topics=TOPICS) as watch:
        async def grown() -> bool:
            md = await kube.machine_deployment(POOL)
            return int(md["spec"]["replicas"]) >= 3

        await settled(grown, "the MachineDeployment's replicas grown", timeout_s=120.0)
        # The machine is on its way (no Machine, no Node yet; the step waits for them): its 8
        # GPUs come off the pending pod's, which still waits (an item: no scale-in under it).
        async def netted() -> DemandEntry | None:
            entry = await pending_jobs(redis_url, namespace)
            return entry if entry is not None and entry.gpus == 0.0 else None

        entry = await settled(netted, "the pending pod's GPUs netted by the machine coming")
        assert entry.items == 1
        assert [p["metadata"]["name"] for p in await kube.pods()
                if not p["spec"].get("nodeName")] == [pending]
        # The pool's load dips, then comes back: the scale need's episode ends and a new one
        # begins. Only the demand net of the machine on its way keeps it inside the range.
        start = len(watch.records)
        for node in nodes:
            fleet.inject_fault(tmp_path, node, load_pct=10.0)
        await periods(watch, 2, "two periods at the dipped load", start=start,
                      load=lambda pct: pct < 20.0)
        start = len(watch.records)
        for node in nodes:
            fleet.inject_fault(tmp_path, node, load_pct=LOAD_PCT)
        await periods(watch, HOLD_S + 3, "the scale need's hold over at the load back",
                      start=start, load=lambda pct: pct > 40.0)
        await watch.catch_up()
        back = [h for h in healths(watch, start) if h.gpu_utilization_pct > 40.0]
        assert {h.demand_pct for h in back} == {0.0}, back
        assert len(scale_out_needs(watch)) == 1, scale_out_needs(watch)
        assert len(scale_out_tasks(watch)) == 1, list(scale_out_tasks(watch))

        # The infrastructure provider's part: the new Machine, and its Node joins; the step
        # that waited for it names and enrols it, and the pod runs there.
        new_machine, machine = await kube.add_machine(POOL, "3")
        events, plan = await first_scale_out(watch)
        added = step_outputs(events, "add_capacity")
        assert added["backend"] == "kubernetes", added
        # One 8-GPU machine covers the pending pod's 8 GPUs; the step waited for its Node.
        assert (added["replicas_before"], added["replicas_after"]) == (2, 3), added
        assert added["outcome"] == "applied", added
        assert (added["added"], added["added_nodes"]) == (1, machine), added
        await assert_enrolled(redis_url, namespace, machine)
        machine_record = record_on(await kube.machine(new_machine))
        assert (machine_record["task_id"], machine_record["state"]) == (
            str(plan.task_id), "added")
        record = record_on(await kube.machine_deployment(POOL))
        assert record["task_id"] == str(plan.task_id), record
        await pod_runs_on(kube, pending, machine)
        await watch.catch_up()
        assert list(scale_out_tasks(watch)) == [plan.task_id]
        assert int((await kube.machine_deployment(POOL))["spec"]["replicas"]) == 3

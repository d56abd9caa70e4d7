"""Capacity of a Kubernetes cluster end to end, on the real API server (kwok nodes, the real
scheduler), Kafka, Redis and every service as a process.

Two kwok nodes run a GPU StatefulSet whose third pod fits nowhere (pending: queued demand) and
their agents report the pool above its range: the analyzer raises scale_out, and the
executor's add_capacity step goes through the cluster's backend. With the standby pool, the
standby node is uncordoned (with the task's record on it) and the pending pod is scheduled
there. With a Cluster API MachineDeployment, its replicas grow by the machines the pending
GPUs need; the test plays the infrastructure and creates the new Machine and its Node, which
the step waits for, names and enrols; the pod is scheduled there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

from agent import fleet
from schemas.events.v1 import OpsTask, TaskEvent
from schemas.kubernetes import CAPACITY_ANNOTATION, STANDBY_LABEL
from schemas.topics import Topic
from services.backends.kubernetes.connection import KubeAccess
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
# Above the pool's range from the first report: the scale need holds.
HOT_PCT = 90.0
ENDED = ("succeeded", "failed", "terminated")


def env_for(kafka_bootstrap: str, redis_url: str, namespace: str, state: Path,
            kube_api: KubeAccess) -> dict[str, str]:
    return kube_env(kafka_bootstrap, redis_url, namespace, state, str(kube_api.kubeconfig),
                    needs='["scale"]', ANALYZER_SCALE__HOLD_S="3", ANALYZER_POOL_PERIOD_S="1",
                    SCHEDULER_RATE_PER_S="10")


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


async def first_scale_out(watch: Tap, state: Path,
                          nodes: list[str]) -> tuple[list[TaskEvent], OpsTask]:
    """The pool's first scale_out task, once it ended (succeeded); the load then drops, as
    the added capacity takes the queued work."""
    def first_ended(_: Record) -> bool:
        tasks = list(scale_out_tasks(watch).values())
        return bool(tasks) and any(e.step_state is None and e.state in ENDED
                                   for e in tasks[0])

    await watch.wait_for(first_ended, TASK_TIMEOUT_S, "the first scale_out task to end")
    for node in nodes:
        fleet.inject_fault(state, node, load_pct=LOAD_PCT)
    events = next(iter(scale_out_tasks(watch).values()))
    assert final(events).state == "succeeded", story(events)
    plan = next(e.task for e in events if e.task is not None)
    assert plan is not None
    assert [s.action.action for s in plan.steps] == ["add_capacity", "migrate_jobs"]
    return events, plan


async def assert_enrolled(redis_url: str, namespace: str, node: str) -> None:
    """The node is in the cluster's registry, so its agent's reports count."""
    redis = connect_redis(redis_url)
    try:
        assert node in await registered_nodes(redis, Keys(namespace), "itest")
    finally:
        await redis.aclose()


async def test_pending_gpu_pods_in_a_hot_pool_get_a_standby_node_uncordoned(
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
    async with kube_cluster(env, tmp_path, kube_api, nodes, load_pct=HOT_PCT) as watch:
        events, plan = await first_scale_out(watch, tmp_path, nodes)
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


async def test_pending_gpu_pods_in_a_hot_pool_grow_its_machine_deployment(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    nodes, pending = await two_full_nodes_and_a_pending_pod(kube)
    await kube.add_machine_deployment(POOL, replicas=2, gpus=8)
    env = env_for(kafka_bootstrap, redis_url, namespace, tmp_path, kube_api)
    async with kube_cluster(env, tmp_path, kube_api, nodes, load_pct=HOT_PCT,
                            capacity="machinedeployment",
                            capacity_namespace=kube.namespace) as watch:
        async def grown() -> bool:
            md = await kube.machine_deployment(POOL)
            return int(md["spec"]["replicas"]) >= 3

        await settled(grown, "the MachineDeployment's replicas grown", timeout_s=120.0)
        # The infrastructure provider's part: the new Machine, and its Node joins.
        new_machine, machine = await kube.add_machine(POOL, "3")
        events, plan = await first_scale_out(watch, tmp_path, nodes)
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
        # The record on it is a scale_out task's (this one, unless a later one scaled again).
        record = record_on(await kube.machine_deployment(POOL))
        assert UUID(record["task_id"]) in scale_out_tasks(watch), record
        await pod_runs_on(kube, pending, machine)

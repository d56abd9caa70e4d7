"""One control centre, two clusters: the same node name in each, kept apart end to end."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from agent import fleet
from agent.store import META_FILE, CheckpointMeta, checkpoint_dir
from common.signing import ensure_signer_keys
from schemas.events.v1 import NodeReport, OpsNeed, PoolHealth, TaskEvent
from schemas.topics import Topic
from services.shared.locks import job_lock, node_lock
from services.shared.registry import register
from tests.integration.harness import Record, Tap, name, services, stack_env, tap
from tests.integration.test_remediation import step_outputs, task_events

CLUSTERS = ("east", "west")
NODES = ["node-001", "node-002"]
JOB = "node-001.train"  # the same job id in each cluster


def health_of(cluster: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.OPS_POOL_HEALTH.value):
            return False
        health = PoolHealth.model_validate_json(record.value)
        return health.cluster_id == cluster and health.nodes_by_state.get("up") == 2
    return check


def offline_need(record: Record) -> bool:
    return record.topic.endswith(Topic.OPS_NEEDS.value)


async def test_two_clusters_with_the_same_node_names_stay_apart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_POOL_PERIOD_S="1")
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        fleets = {cluster: tmp_path / cluster for cluster in CLUSTERS}
        try:
            for cluster, state in fleets.items():
                agents = fleet.fleet_up(2, 1, cluster, namespace, state, env, trusted, 1.0)
                await register(redis_url, namespace, cluster, [a.node_id for a in agents])
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_POOL_HEALTH, namespace)) as watch:
                for cluster in fleets:
                    await watch.wait_for(health_of(cluster), 60, f"{cluster}'s pool health")
                fleet.inject_fault(fleets["west"], "node-001", xid=[79])
                record = await watch.wait_for(offline_need, 60, "an offline need")
                need = OpsNeed.model_validate_json(record.value)
                assert (need.cluster_id, need.target, need.kind) == ("west", "node-001",
                                                                     "offline")
                # A pool period after the need (a fresh record, not one read before): east
                # is still whole, and no need was raised for it meanwhile.
                await watch.wait_for(health_of("east"), 60, "east still healthy after the need",
                                     start=len(watch.records))
                await watch.catch_up()
                needs = [OpsNeed.model_validate_json(r.value) for r in watch.records
                         if offline_need(r)]
                assert {(n.cluster_id, n.target) for n in needs} == {("west", "node-001")}
        finally:
            for state in fleets.values():
                fleet.fleet_down(state)


def family(events: Tap, cluster: str, target: str) -> tuple[list[TaskEvent], list[TaskEvent]]:
    """The events of the task of `cluster` aimed at `target`, and those of its children."""
    parsed = task_events(events)
    parents = {e.task_id for e in parsed if e.task is not None and e.task.target == target
               and e.cluster_id == cluster and e.task.parent_task_id is None}
    children = {e.task_id for e in parsed if e.task is not None
                and e.task.parent_task_id in parents}
    return ([e for e in parsed if e.task_id in parents],
            [e for e in parsed if e.task_id in children])


def finished(events: Tap, cluster: str) -> bool:
    parent, _ = family(events, cluster, "node-001")
    return any(e.state in ("succeeded", "failed", "terminated") for e in parent)


def runs_job(cluster: str, node: str, job: str) -> Callable[[Record], bool]:
    """True for a report of `node` of `cluster` that lists `job` running."""
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.NODE_REPORTS.value):
            return False
        report = NodeReport.model_validate_json(record.value)
        return (report.cluster_id, report.node_id) == (cluster, node) and any(
            j.job_id == job and j.state == "running" for j in report.jobs)
    return check


def check_remedied_inside(watch: Tap, cluster: str, store: Path,
                          destinations: Collection[str] = ("node-002",)) -> str:
    """One cluster's offline task of node-001: succeeded, its job moved inside the cluster
    (to one of `destinations`), every lock and checkpoint its own; the job's destination."""
    parent, children = family(watch, cluster, "node-001")
    reasons = [e.reason for e in parent + children]
    assert parent[-1].state == "succeeded", reasons
    assert {e.cluster_id for e in parent + children} == {cluster}, reasons
    plan = parent[0].task
    assert plan is not None
    assert plan.mutex_keys[0] == node_lock(cluster, "node-001")
    assert children, reasons
    assert children[-1].state == "succeeded", reasons
    child = next(e.task for e in children if e.task is not None)
    destination = getattr(child.steps[1].action, "node_id", "")
    assert child.cluster_id == cluster
    assert destination in destinations, (destination, reasons)
    assert child.mutex_keys == [job_lock(cluster, JOB), node_lock(cluster, destination)]
    out, into = step_outputs(children, "migrate_job"), step_outputs(children, "start_job")
    assert out["job_id"] == into["job_id"] == JOB
    # Resumed from its own cluster's checkpoint, which the store keeps apart.
    assert into["resumed_step"] == out["step"]
    meta = CheckpointMeta.model_validate_json(
        (checkpoint_dir(store, cluster, JOB) / META_FILE).read_bytes())
    assert (meta.cluster_id, meta.step, meta.to_node) == (cluster, out["step"], destination)
    return destination


async def test_a_fault_on_the_same_node_of_each_cluster_is_remedied_inside_each_cluster(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"  # one store for both clusters, as a shared mount
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="sim:train",
                    AGENT_CHECKPOINT_STORE=str(store), ANALYZER_POOL_PERIOD_S="1",
                    ANALYZER_ENABLED_NEEDS='["offline"]',
                    # Two nodes a pool: one offline is half of it, below this share.
                    SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.6")
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path):
        fleets = {cluster: tmp_path / cluster for cluster in CLUSTERS}
        try:
            for cluster, state in fleets.items():
                await register(redis_url, namespace, cluster, NODES)
                fleet.fleet_up(len(NODES), 2, cluster, namespace, state, env, trusted, 1.0)
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_POOL_HEALTH, namespace),
                           name(Topic.NODE_REPORTS, namespace)) as watch:
                for cluster in CLUSTERS:
                    await watch.wait_for(health_of(cluster), 60, f"{cluster}'s pool health")
                # The same fault on the same node name in both clusters, at once.
                for state in fleets.values():
                    fleet.inject_fault(state, "node-001", xid=[79])
                await watch.wait_for(lambda _: all(finished(watch, c) for c in CLUSTERS), 240,
                                     "both offline tasks of node-001 to finish")
                moved = {c: check_remedied_inside(watch, c, store) for c in CLUSTERS}
                # Two tasks, one per cluster, sharing no lock.
                east, west = (family(watch, c, "node-001") for c in CLUSTERS)
                locks = [{k for e in p + ch if e.task for k in e.task.mutex_keys}
                         for p, ch in (east, west)]
                assert east[0][0].task_id != west[0][0].task_id
                assert not locks[0] & locks[1], locks
                # Each job runs on its new node, as that cluster's agent reports it.
                for cluster, node in moved.items():
                    await watch.wait_for(runs_job(cluster, node, JOB), 60,
                                         f"{JOB} running on {cluster}'s {node}")
        finally:
            for state in fleets.values():
                fleet.fleet_down(state)

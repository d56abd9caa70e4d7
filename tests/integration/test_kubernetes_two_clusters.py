"""Two clusters on two backends, with the same node names, stay apart end to end.

Cluster `east` is registered with the kubernetes backend: kwok nodes `node-001`..`node-003` on
the real API server, StatefulSet `train` Running on node-001, an agent process per node reading
its pods. Cluster `west` is registered with the local backend: agent processes `node-001`..
`node-003`, each running its own (simulated) training job. Every service runs as a process
over Kafka and Redis.

A fatal XID on east/node-001: the Kubernetes node alone is cordoned, tainted and claimed and
its pods are evicted to east's other nodes; west/node-001's agent gets no command and keeps its
job. Then a fatal XID on west/node-001: its agent is drained and taken offline by signed
commands and its job moves to another west node; the Kubernetes node-001 keeps the first claim
(no second one), no pod is evicted, and the Kubernetes node-002 and node-003 (names west's job
may move to) are left as they were. Each task holds only its own cluster's locks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent import fleet
from common.signing import ensure_signer_keys, unb64url
from schemas.events.v1 import Command, CommandPayload, NodeReport, NodeState, TaskEvent
from schemas.topics import Topic
from services.backends.kubernetes.connection import KubeAccess
from services.shared.locks import node_lock
from services.shared.registry import register
from tests.integration.harness import Record, Tap, name, services, tap
from tests.integration.test_kubernetes_remediation import (
    TASK_TIMEOUT_S,
    a_bad_node_and_two_good,
    check_offline_and_drained,
    claim_of,
    kube_env,
    our_taints,
    register_kube_cluster,
    start_kube_agents,
    step_outputs,
)
from tests.integration.test_two_clusters import JOB, check_remedied_inside, family, finished
from tests.kube import KubeScope

EAST, WEST = "east", "west"
NODES = ["node-001", "node-002", "node-003"]

pytestmark = pytest.mark.timeout(600)  # two remediations; the waits' own deadlines should fail


def up_in(cluster: str, node: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.OPS_NODE_STATE.value):
            return False
        state = NodeState.model_validate_json(record.value)
        return (state.cluster_id, state.node_id, state.state) == (cluster, node, "up")
    return check


def keeps_its_job(cluster: str, node: str) -> Callable[[Record], bool]:
    """A report of `node` of `cluster`: active, running its own training job."""
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.NODE_REPORTS.value):
            return False
        report = NodeReport.model_validate_json(record.value)
        return ((report.cluster_id, report.node_id, report.mode) == (cluster, node, "active")
                and any(j.job_id == JOB and j.state == "running" for j in report.jobs))
    return check


def task_commands(watch: Tap, cluster: str) -> list[CommandPayload]:
    """The signed commands of a task sent to any agent of `cluster` (the collector's probes
    and peer assignments, outside any task, are left out)."""
    payloads = [CommandPayload.model_validate_json(unb64url(
        Command.model_validate_json(r.value).payload)) for r in watch.records
        if r.topic.endswith(Topic.NODE_COMMANDS.value)]
    return [p for p in payloads if p.cluster_id == cluster and p.task_id is not None]


def tasks_of(watch: Tap, cluster: str) -> set[str]:
    parsed = [TaskEvent.model_validate_json(r.value) for r in watch.records
              if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]
    return {str(e.task_id) for e in parsed if e.cluster_id == cluster}


async def pod_uids(kube: KubeScope) -> dict[str, tuple[str, str]]:
    """Each train pod: its uid (a new one after an eviction) and its node."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName") or "")
            for p in await kube.pods()}


async def check_kubernetes_remedied(watch: Tap, kube: KubeScope, node: str,
                                    others: list[str]) -> str:
    """East's offline task of `node`: carried out on the API server alone; its task id."""
    parent, _ = family(watch, EAST, node)
    reasons = [e.reason for e in parent]
    assert parent[-1].state == "succeeded", reasons
    plan = next(e.task for e in parent if e.task is not None)
    assert plan is not None
    assert plan.mutex_keys == [node_lock(EAST, node)]
    drained = step_outputs(parent, "drain_node")
    assert (drained["backend"], drained["evicted"]) == ("kubernetes", 2), drained
    await check_offline_and_drained(kube, node, others, str(plan.task_id))
    return str(plan.task_id)


async def untouched(kube: KubeScope, nodes: list[str]) -> None:
    for node in nodes:
        marks = await kube.node(node)
        assert not marks["spec"].get("unschedulable"), node
        assert (our_taints(marks), claim_of(marks)) == ([], None), node


async def test_a_kubernetes_cluster_and_a_local_one_with_the_same_node_names_stay_apart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_bad_node_and_two_good(kube, min_available=0, names=("node-001",
                                                                         "node-002", "node-003"))
    store = tmp_path / "checkpoints"  # the local cluster's shared checkpoint store
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   needs='["offline"]', AGENT_JOBS="sim:train",
                   AGENT_CHECKPOINT_STORE=str(store))
    trusted = ensure_signer_keys(tmp_path / "keys")
    await register_kube_cluster(env, kube_api, NODES, cluster=EAST)
    await register(redis_url, namespace, WEST, NODES)
    fleets = {EAST: tmp_path / EAST, WEST: tmp_path / WEST}
    async with services(env, tmp_path):
        try:
            start_kube_agents(env, fleets[EAST], NODES, trusted, cluster=EAST)
            fleet.fleet_up(len(NODES), 2, WEST, namespace, fleets[WEST], env, trusted, 1.0)
            async with tap(kafka_bootstrap, *(name(t, namespace) for t in (
                    Topic.OPS_TASK_EVENTS, Topic.OPS_NODE_STATE, Topic.NODE_REPORTS,
                    Topic.NODE_COMMANDS))) as watch:
                for cluster in fleets:
                    for node in NODES:
                        await watch.wait_for(up_in(cluster, node), 60, f"{cluster}/{node} up")

                # A fatal XID on the Kubernetes node-001.
                fleet.inject_fault(fleets[EAST], bad, xid=[79])
                await watch.wait_for(lambda _: finished(watch, EAST), TASK_TIMEOUT_S,
                                     "east's offline task of node-001 to end")
                east_task = await check_kubernetes_remedied(watch, kube, bad, good)
                # West's node-001 still runs its job (a report after the task, not before)...
                await watch.wait_for(keeps_its_job(WEST, bad), 60, "west/node-001 keeps its job",
                                     start=len(watch.records))
                await watch.catch_up()
                # ... and got no command: east's steps went through the API server, to no agent.
                assert task_commands(watch, WEST) == []
                assert task_commands(watch, EAST) == []
                assert tasks_of(watch, WEST) == set()
                claim, pods = claim_of(await kube.node(bad)), await pod_uids(kube)

                # A fatal XID on the local node-001.
                fleet.inject_fault(fleets[WEST], bad, xid=[79])
                await watch.wait_for(lambda _: finished(watch, WEST), TASK_TIMEOUT_S,
                                     "west's offline task of node-001 to end")
                destination = check_remedied_inside(watch, WEST, store, good)
                parent, _ = family(watch, WEST, bad)
                plan = next(e.task for e in parent if e.task is not None)
                assert plan is not None
                west_commands: set[tuple[str, str]] = {(p.node_id, p.action.action)
                                           for p in task_commands(watch, WEST)
                                           if p.task_id == plan.task_id}
                assert {(bad, "drain_node"), (bad, "offline_node")} <= west_commands
                await watch.catch_up()
                # The Kubernetes cluster saw none of it: the same one task and claim, no pod
                # evicted or moved, and its node named like west's destination left alone.
                assert tasks_of(watch, EAST) == {east_task}
                assert task_commands(watch, EAST) == []
                assert claim_of(await kube.node(bad)) == claim
                assert await pod_uids(kube) == pods
                assert destination in good
                await untouched(kube, good)
        finally:
            for state in fleets.values():
                fleet.fleet_down(state)

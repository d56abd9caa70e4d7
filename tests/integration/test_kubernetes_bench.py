"""bench/kubernetes_remediation.py's quick mode end to end: a small kwok cluster on the real API
server, the pipeline's services as processes, the simulated fleet enrolled and signed-for, a
fatal XID on 5 % of the nodes at once. Every faulted node is cordoned, every GPU pod on it is
evicted and replaced by its controller on a healthy node, and the figures say so."""

from __future__ import annotations

from bench.kubernetes_remediation import QUICK, run
from services.backends.kubernetes.connection import KubeAccess


async def test_the_quick_benchmark_cordons_every_faulted_node_and_replaces_its_pods(
        kafka_bootstrap: str, redis_url: str, kube_api: KubeAccess) -> None:
    assert kube_api.kubeconfig is not None
    result = await run(QUICK, kafka_bootstrap, redis_url, kube_api.kubeconfig)

    assert result["nodes"] == QUICK.nodes
    assert result["faulted"] == QUICK.faults == 2
    assert result["cordoned"] == result["faulted"], result
    assert result["pods"] > 0, result
    assert result["evicted"] == result["replaced"] == result["pods"], result
    # Only the faulted nodes were taken out: no false alarm shared the budgets.
    assert result["other_offline_tasks"] == 0, result
    for spread in (result["fault_to_cordoned_s"], result["fault_to_replacements_running_s"],
                   result["fault_to_task_created_s"], result["fault_to_task_succeeded_s"]):
        p50, p99, top = spread["p50"], spread["p99"], spread["max"]
        assert p50 is not None, result
        assert p99 is not None, result
        assert top is not None, result
        assert 0.0 < p50 <= p99 <= top, result
    faulted = {n["node"] for n in result["per_node"]}
    for node in result["per_node"]:
        cordoned, replaced = node["cordoned_s"], node["replaced_s"]
        assert cordoned is not None, node
        assert replaced is not None, node
        # The drain cordons first; the controllers' replacements run on healthy nodes.
        assert cordoned <= replaced, node
        assert node["replaced_on"], node
        assert not set(node["replaced_on"]) & faulted, node
    assert result["eviction_budget_per_s"] == QUICK.evictions_per_s
    assert result["evictions_per_s"] is not None, result

"""A Kubernetes node's conditions as fault data: Ready False or Unknown (after the grace a
joining node gets), and each problem condition of the configured list that is True, one
`node_condition` fault each; the agent on the node reports them (AGENT_JOBS=kube)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.app import make_jobs
from agent.jobs.kube_node import DEFAULT_FAULTY, ConditionRule, condition_faults
from agent.jobs.kube_pods import KubePods
from agent.settings import AgentSettings

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
RULE = ConditionRule(faulty=("GPUProblem", "KernelDeadlock"), not_ready_after_s=30.0)


def condition(kind: str, status: str, *, ago_s: float = 600.0, reason: str = "",
              message: str = "") -> dict[str, Any]:
    since = (NOW - timedelta(seconds=ago_s)).isoformat().replace("+00:00", "Z")
    return {"type": kind, "status": status, "lastTransitionTime": since, "reason": reason,
            "message": message}


def node(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1"}, "status": {"conditions": list(conditions)}}


def details(found: dict[str, Any] | None, rule: ConditionRule = RULE) -> list[str]:
    faults = condition_faults(found, rule, NOW)
    assert all(f.kind == "node_condition" for f in faults)
    return [f.detail for f in faults]


def test_a_healthy_node_and_a_node_not_seen_yet_have_no_fault() -> None:
    healthy = node(condition("Ready", "True"), condition("GPUProblem", "False"),
                   condition("MemoryPressure", "False"))
    assert details(healthy) == []
    assert details(None) == []
    assert details(node()) == []


def test_a_problem_condition_that_is_true_is_a_fault_saying_why() -> None:
    sick = node(condition("Ready", "True"),
                condition("GPUProblem", "True", reason="XidStorm", message="xid 79 on gpu 3"),
                condition("KernelDeadlock", "True"),
                # Not in the configured list: not fault data.
                condition("ReadonlyFilesystem", "True"))
    assert details(sick) == ["GPUProblem=True: XidStorm: xid 79 on gpu 3", "KernelDeadlock=True"]


def test_ready_false_or_unknown_is_a_fault_once_it_lasted_the_grace() -> None:
    assert details(node(condition("Ready", "False", reason="KubeletNotReady"))) == [
        "Ready=False: KubeletNotReady"]
    assert details(node(condition("Ready", "Unknown", reason="NodeStatusUnknown",
                                  message="Kubelet stopped posting node status."))) == [
        "Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status."]
    # A node joining the cluster is NotReady for a while: not yet a fault.
    assert details(node(condition("Ready", "False", ago_s=10.0))) == []
    assert details(node(condition("Ready", "False", ago_s=10.0)),
                   ConditionRule(not_ready_after_s=0.0)) == ["Ready=False"]


def test_the_agent_setting_names_the_conditions_and_the_grace(tmp_path: Path) -> None:
    settings = AgentSettings(node_id="gpu-1", jobs="kube",
                             node_fault_conditions="GPUProblem, NvLinkDown",  # type: ignore[arg-type]
                             not_ready_after_s=5.0)
    source = make_jobs(settings, tmp_path)
    assert isinstance(source, KubePods)
    assert source.conditions == ConditionRule(("GPUProblem", "NvLinkDown"), 5.0)
    assert AgentSettings(node_id="gpu-1").node_fault_conditions == list(DEFAULT_FAULTY)
    source.node = node(condition("NvLinkDown", "True"))
    assert [f.detail for f in source.node_faults(NOW)] == ["NvLinkDown=True"]

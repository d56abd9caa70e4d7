"""A Kubernetes node's jobs are its GPU pods: each pod asking nvidia.com/gpu is one job, named
`<namespace>.<pod>`, its state from the pod's phase (an evicted pod is stopping), its GPUs the
next free indices; pods without GPUs are not jobs. AGENT_JOBS=kube selects this source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.app import make_jobs
from agent.jobs.kube_pods import KubePods, node_mode, pod_jobs
from agent.settings import AgentSettings
from schemas.events.v1 import now_utc
from schemas.kube_gpus import pod_gpus
from schemas.kubernetes import OFFLINE_ANNOTATION


def pod(name: str, gpus: int | None, phase: str = "Running", *, namespace: str = "ml",
        deleting: bool = False, limits_only: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        asked = {"nvidia.com/gpu": str(gpus)}
        resources = {"limits": asked} if limits_only else {"requests": asked, "limits": asked}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T03:00:00Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": resources}]},
            "status": {"phase": phase}}


def test_gpu_pods_are_the_nodes_jobs_in_name_order_with_the_next_free_gpus() -> None:
    jobs = pod_jobs([pod("train-1", 2), pod("web", None), pod("train-0", 1, "Pending"),
                     pod("train-2", 1, deleting=True, limits_only=True)], gpus=8)
    assert [(j.job_id, j.state, j.gpu_indices) for j in jobs] == [
        ("ml.train-0", "starting", [0]),
        ("ml.train-1", "running", [1, 2]),
        ("ml.train-2", "stopped", [3]),
    ]
    assert all(j.kind == "training" for j in jobs)


def test_indices_never_pass_the_nodes_gpus_and_odd_requests_count_as_none() -> None:
    jobs = pod_jobs([pod("a", 2), pod("b", 2)], gpus=3)
    assert [j.gpu_indices for j in jobs] == [[0, 1], [2]]
    broken = pod("c", None)
    broken["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "lots"}}
    assert pod_gpus(broken) == 0


def test_agent_jobs_kube_reads_the_pods_of_the_node_named_by_the_agent(tmp_path: Path) -> None:
    settings = AgentSettings(node_id="gpu-7", jobs="kube", kubeconfig="/k/admin.kubeconfig")
    assert settings.kube_pods
    assert settings.job_names() == []
    source = make_jobs(settings, tmp_path)
    assert isinstance(source, KubePods)
    assert (source.node_id, source.kubeconfig) == ("gpu-7", "/k/admin.kubeconfig")
    assert source.snapshot(now_utc()) == []  # nothing read yet


def test_a_node_carrying_clusterwardens_claim_reports_offline_and_no_other_does() -> None:
    claimed = {"metadata": {"annotations": {OFFLINE_ANNOTATION: "{}"}},
               "spec": {"unschedulable": True}}
    cordoned_by_a_person = {"metadata": {"annotations": {}}, "spec": {"unschedulable": True}}
    assert node_mode(claimed, "active") == "offline"
    assert node_mode(cordoned_by_a_person, "active") == "active"
    assert node_mode(None, "draining") == "draining"

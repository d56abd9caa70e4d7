"""GPU facts from Kubernetes objects: node GPUs, GPU pods, pending demand, replacements."""

from __future__ import annotations

from typing import Any

from schemas.kube_gpus import pod_gpus
from services.backends.kubernetes.gpus import PodRef, build_inventory, find_replacement


def pod(name: str, *, node: str | None, gpus: int = 1, phase: str = "Running",
        owner: str | None = "sts-1", uid: str | None = None,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "StatefulSet"}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def node(name: str, gpus: int, *, unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                       "allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "GpuDriverFault", "status": "False"}]}}


def test_a_pod_counts_the_gpus_its_containers_ask() -> None:
    two = pod("a", node="n", gpus=2)
    two["spec"]["containers"].append({"name": "d", "resources": {"requests": {
        "nvidia.com/gpu": "1"}}})
    assert pod_gpus(two) == 3
    assert pod_gpus(pod("b", node="n", gpus=0)) == 0


def test_inventory_has_gpu_nodes_gpu_pods_per_node_and_pending_demand() -> None:
    inventory = build_inventory(
        [node("n2", 8, unschedulable=True), node("n1", 8), node("cpu", 0)],
        [pod("a", node="n1", gpus=2), pod("b", node=None, gpus=4, phase="Pending"),
         pod("c", node="n1", gpus=0), pod("d", node="n2", phase="Succeeded"),
         pod("e", node="n2", deleting=True)])
    assert [(n.name, n.capacity, n.schedulable, n.ready) for n in inventory.nodes] == [
        ("n1", 8, True, True), ("n2", 8, False, True)]
    assert inventory.nodes[0].conditions["GpuDriverFault"] == "False"
    assert [p.name for p in inventory.pods_by_node["n1"]] == ["a"]
    assert "n2" not in inventory.pods_by_node
    assert [p.name for p in inventory.pending] == ["b"]
    assert inventory.pending_gpus == 4


def test_the_replacement_is_the_controllers_new_running_pod_on_another_node() -> None:
    evicted = PodRef.of(pod("w-0", node="bad", uid="old"))
    pods = [
        pod("w-0", node="bad", uid="old"),                  # the evicted pod itself
        pod("w-0", node=None, uid="new", phase="Pending"),  # not placed yet
        pod("x-0", node="good", owner="other"),             # another controller's
    ]
    assert find_replacement(evicted, pods, {"old"}) is None
    pods.append(pod("w-0", node="good", uid="new"))
    match = find_replacement(evicted, pods, {"old"})
    assert match is not None
    assert match["spec"]["nodeName"] == "good"


def test_a_replacement_claimed_by_another_evicted_pod_is_not_counted_twice() -> None:
    evicted = PodRef.of(pod("w-1", node="bad", uid="old-1"))
    pods = [pod("w-0", node="good", uid="new-0"), pod("w-1", node="good", uid="new-1")]
    match = find_replacement(evicted, pods, {"old-1"})
    assert match is not None
    assert match["metadata"]["uid"] == "new-1"  # same name first
    assert find_replacement(evicted, pods, {"old-1", "new-1", "new-0"}) is None


def test_a_statefulset_pods_replacement_is_the_pod_of_its_name_never_a_sibling() -> None:
    # Both pods were evicted at once; train-1's replacement came back first.
    evicted = PodRef.of(pod("train-0", node="bad", uid="old-0"))
    sibling_back = [pod("train-1", node="good", uid="new-1")]
    assert find_replacement(evicted, sibling_back, {"old-0", "old-1"}) is None
    # A ReplicaSet's replacements get new names: any of its new pods will do.
    rs = pod("web-abc", node="bad", uid="old-0")
    rs["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    other = pod("web-xyz", node="good", uid="new-1")
    other["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    match = find_replacement(PodRef.of(rs), [other], {"old-0"})
    assert match is not None
    assert match["metadata"]["uid"] == "new-1"

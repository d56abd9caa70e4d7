"""Queued demand on Kubernetes, the pure half: each pending GPU pod's pool (nodeSelector, a
required node affinity naming one pool, else the cluster's default pool), and the GPUs on
their way (standby nodes added and not arrived, a MachineDeployment's machines without a
Node) subtracted from it."""

from __future__ import annotations

from typing import Any

from schemas.kubernetes import CAPACITY_ANNOTATION, POOL_LABEL, STANDBY_LABEL
from services.backends.base import PoolDemand
from services.backends.kubernetes.capacity import CapacityRecord
from services.backends.kubernetes.demand import (
    machines_on_the_way,
    net_demand,
    pod_pool,
    queued_by_pool,
    selected_pool,
    standby_on_the_way,
)


def pod(name: str, *, gpus: int = 8, node: str | None = None, phase: str = "Pending",
        selector: dict[str, str] | None = None,
        terms: list[list[dict[str, Any]]] | None = None,
        deleting: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]}
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def pool_in(*values: str) -> dict[str, Any]:
    return {"key": POOL_LABEL, "operator": "In", "values": list(values)}


def node(name: str, *, gpus: int = 8, allocatable: int | None = None, ready: bool = True,
         pool: str | None = None, standby: bool = False,
         record: CapacityRecord | None = None) -> dict[str, Any]:
    labels = {STANDBY_LABEL: "true"} if standby else {}
    if pool:
        labels[POOL_LABEL] = pool
    annotations = {CAPACITY_ANNOTATION: record.to_json()} if record else {}
    offered = gpus if allocatable is None else allocatable
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": standby and record is None},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                       "allocatable": {"nvidia.com/gpu": str(offered)},
                       "conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}


def added(pool: str = "default", state: str = "added") -> CapacityRecord:
    return CapacityRecord(task_id="t-1", step="0:add-capacity", pool=pool,
                          state=state)  # type: ignore[arg-type]


def test_a_pod_waits_for_the_pool_its_node_selector_names() -> None:
    assert selected_pool(pod("a", selector={POOL_LABEL: "train", "zone": "x"})) == "train"
    assert pod_pool(pod("b", selector={"zone": "x"}), "default") == "default"
    assert pod_pool(pod("c"), "gpu-east") == "gpu-east"


def test_a_required_affinity_pins_the_pool_only_when_every_term_names_the_same_one() -> None:
    assert selected_pool(pod("a", terms=[[pool_in("train")]])) == "train"
    assert selected_pool(pod("b", terms=[[pool_in("train")], [pool_in("train")]])) == "train"
    # Alternatives: one term names another pool, or none; several values: any of them.
    assert selected_pool(pod("c", terms=[[pool_in("train")], [pool_in("infer")]])) is None
    assert selected_pool(pod("d", terms=[[pool_in("train")],
                                         [{"key": "zone", "operator": "In",
                                           "values": ["x"]}]])) is None
    assert selected_pool(pod("e", terms=[[pool_in("train", "infer")]])) is None
    assert selected_pool(pod("f", terms=[[{"key": POOL_LABEL, "operator": "NotIn",
                                           "values": ["train"]}]])) is None
    # The node selector and the affinity must both hold: the selector decides.
    assert selected_pool(pod("g", selector={POOL_LABEL: "infer"},
                             terms=[[pool_in("infer")]])) == "infer"


def test_only_live_unbound_gpu_pods_are_queued_per_pool() -> None:
    pods = [pod("a"), pod("b", gpus=4), pod("c", selector={POOL_LABEL: "infer"}, gpus=2),
            pod("running", node="n-1", phase="Running"), pod("bound", node="n-2"),
            pod("cpu", gpus=0), pod("going", deleting=True), pod("done", phase="Failed")]
    assert queued_by_pool(pods, "default") == {"default": (2, 12), "infer": (1, 2)}


def test_standby_nodes_added_and_not_arrived_are_on_their_way() -> None:
    nodes = [node("coming", ready=False, standby=True, record=added()),
             node("no-plugin-yet", allocatable=0, standby=True, record=added("train")),
             node("arrived", standby=True, record=added()),
             node("returning", ready=False, standby=True, record=added(state="returning")),
             node("in-standby", ready=False, standby=True),
             node("plain", ready=False)]
    assert standby_on_the_way(nodes) == {"default": 8, "train": 8}


def test_machines_asked_for_without_an_arrived_node_are_on_their_way() -> None:
    nodes = [node("a"), node("b"), node("booting", ready=False),
             node("other", pool="infer"), node("spare", standby=True),
             node("taken", standby=True, record=added())]
    # a, b and the standby node ClusterWarden took are the default pool's arrived nodes.
    assert machines_on_the_way(5, nodes, "default", "default") == 2
    assert machines_on_the_way(3, nodes, "default", "default") == 0
    assert machines_on_the_way(2, nodes, "infer", "default") == 1
    assert machines_on_the_way(1, nodes, "train", "default") == 1


def test_the_gpus_on_their_way_come_off_the_pending_gpus_not_the_pods() -> None:
    assert net_demand("default", 2, 16, 8) == PoolDemand("default", 2, 8, 8)
    # More on the way than pending: no GPU queued, the pods still wait (scale-in stays off).
    assert net_demand("default", 1, 8, 16) == PoolDemand("default", 1, 0, 16)
    assert net_demand("default", 1, 8, 0) == PoolDemand("default", 1, 8, 0)

"""GPU facts read from Kubernetes objects (serialised JSON, camelCase keys): pure functions.

A node's GPUs are its `nvidia.com/gpu` capacity and allocatable (the device plugin's extended
resource); a pod's are its effective request (schemas/kube_gpus.py, the agent's rule too).
A GPU pod no node took yet is queued demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.kube_gpus import gpu_quantity, pod_gpus
from schemas.kubernetes import GPU_RESOURCE
from services.backends.base import GpuPod, Inventory, NodeGpus

_DONE_PHASES = ("Succeeded", "Failed")


def node_gpus(node: Mapping[str, Any]) -> NodeGpus:
    meta, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
    conditions = {c["type"]: c.get("status", "Unknown") for c in status.get("conditions") or ()}
    return NodeGpus(
        name=meta["name"],
        capacity=gpu_quantity((status.get("capacity") or {}).get(GPU_RESOURCE, 0)),
        allocatable=gpu_quantity((status.get("allocatable") or {}).get(GPU_RESOURCE, 0)),
        schedulable=not spec.get("unschedulable"),
        ready=conditions.get("Ready") == "True",
        conditions=conditions,
    )


def gpu_pod(pod: Mapping[str, Any]) -> GpuPod:
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    return GpuPod(namespace=meta.get("namespace", ""), name=meta["name"], gpus=pod_gpus(pod),
                  node=spec.get("nodeName") or None, phase=status.get("phase", "Unknown"))


def live(pod: Mapping[str, Any]) -> bool:
    """Not finished and not being deleted."""
    return (((pod.get("status") or {}).get("phase") not in _DONE_PHASES)
            and not (pod.get("metadata") or {}).get("deletionTimestamp"))


def build_inventory(nodes: Iterable[Mapping[str, Any]],
                    pods: Iterable[Mapping[str, Any]]) -> Inventory:
    gpu_nodes = tuple(sorted((node_gpus(n) for n in nodes if node_gpus(n).capacity > 0),
                             key=lambda n: n.name))
    by_node: dict[str, list[GpuPod]] = {}
    pending: list[GpuPod] = []
    for pod in pods:
        if not live(pod) or pod_gpus(pod) == 0:
            continue
        view = gpu_pod(pod)
        if view.node is None:
            pending.append(view)
        else:
            by_node.setdefault(view.node, []).append(view)
    return Inventory(nodes=gpu_nodes,
                     pods_by_node={n: tuple(p) for n, p in sorted(by_node.items())},
                     pending=tuple(pending))


@dataclass(frozen=True)
class PodRef:
    """A pod about to be evicted: what its replacement is recognised by."""

    namespace: str
    name: str
    uid: str
    node: str
    controller_uid: str | None
    """The owning controller's uid (StatefulSet, ReplicaSet, Job, ...); None: no controller."""
    controller_kind: str | None = None

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        meta = pod.get("metadata") or {}
        controller = next((o for o in meta.get("ownerReferences") or () if o.get("controller")),
                          None)
        return cls(namespace=meta.get("namespace", ""), name=meta["name"],
                   uid=meta.get("uid", ""), node=(pod.get("spec") or {}).get("nodeName", ""),
                   controller_uid=controller.get("uid") if controller else None,
                   controller_kind=controller.get("kind") if controller else None)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def find_replacement(evicted: PodRef, pods: Iterable[Mapping[str, Any]],
                     excluded_uids: set[str]) -> Mapping[str, Any] | None:
    """A Running pod of the same controller on another node, not one seen before the drain nor
    claimed by another evicted pod; one of the same name first. A StatefulSet's replacement
    keeps its pod's name, so only that one counts: a sibling evicted at the same time and
    already back must not be taken for it."""
    candidates = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        ref = PodRef.of(pod)
        if (ref.namespace == evicted.namespace and ref.controller_uid == evicted.controller_uid
                and ref.uid not in excluded_uids and spec.get("nodeName")
                and spec.get("nodeName") != evicted.node and live(pod)
                and (pod.get("status") or {}).get("phase") == "Running"):
            renamed = meta.get("name") != evicted.name
            if renamed and evicted.controller_kind == "StatefulSet":
                continue
            candidates.append((renamed, meta.get("name", ""), pod))
    return min(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None

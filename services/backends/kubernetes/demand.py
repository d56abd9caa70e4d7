"""Queued demand on Kubernetes, the pure half: which pool each pending GPU pod waits for, and
how many GPUs are already on their way there (docs/kubernetes.md, "Queued demand").

**A pending pod's pool** is the `clusterwarden.io/pool` label it selects: its `nodeSelector`,
or else a required node affinity whose every term asks that label `In` one and the same value.
A pod that names no pool (or several) waits for the cluster's default pool, the one its agents
report in.

**On its way**: GPUs ClusterWarden already asked for that pods cannot be placed on yet, so a
second scale-out is not raised for the same pods while the first one's nodes come up:

* a standby node ClusterWarden uncordoned (its capacity record says `added`) that is not yet
  Ready with allocatable GPUs: its GPUs;
* a pool's MachineDeployment whose replicas are above the pool's Nodes that are Ready with
  allocatable GPUs (standby nodes not taken are not its machines): the missing machines times
  the GPUs of one machine.

A node counts as arrived once it is Ready and offers GPUs; from then on pods still pending are
demand again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schemas.kube_gpus import pod_gpus
from schemas.kubernetes import POOL_LABEL
from services.backends.base import NodeGpus, PoolDemand
from services.backends.kubernetes.capacity import is_standby, record_of
from services.backends.kubernetes.gpus import live, node_gpus
from services.backends.kubernetes.protocol import NodeView

Obj = Mapping[str, Any]


def _term_pool(term: Obj) -> str | None:
    """The one pool a node selector term asks for (None: none, or several)."""
    asked = [e for e in term.get("matchExpressions") or () if e.get("key") == POOL_LABEL]
    if len(asked) != 1 or asked[0].get("operator") != "In":
        return None
    values = asked[0].get("values") or []
    return str(values[0]) if len(values) == 1 else None


def selected_pool(pod: Obj) -> str | None:
    """The pool a pod's scheduling constraints pin it to, or None."""
    spec = pod.get("spec") or {}
    if pool := (spec.get("nodeSelector") or {}).get(POOL_LABEL):
        return str(pool)
    required = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution")) or {})
    # The terms are alternatives: the pod is pinned only if each of them names the same pool.
    pools = {_term_pool(t) for t in required.get("nodeSelectorTerms") or ()}
    return next(iter(pools)) if len(pools) == 1 and None not in pools else None


def pod_pool(pod: Obj, default_pool: str) -> str:
    return selected_pool(pod) or default_pool


def pending(pod: Obj) -> bool:
    """A live GPU pod no node took yet."""
    return (live(pod) and not (pod.get("spec") or {}).get("nodeName")
            and pod_gpus(pod) > 0)


def queued_by_pool(pods: Iterable[Obj], default_pool: str) -> dict[str, tuple[int, int]]:
    """pool -> (pending GPU pods, their GPUs)."""
    queued: dict[str, tuple[int, int]] = {}
    for pod in pods:
        if pending(pod):
            pool = pod_pool(pod, default_pool)
            items, gpus = queued.get(pool, (0, 0))
            queued[pool] = (items + 1, gpus + pod_gpus(pod))
    return queued


def arrived(node: NodeGpus) -> bool:
    """Pods can be placed on the node's GPUs: it is Ready and offers some."""
    return node.ready and node.allocatable > 0


def node_pool(node: Obj, default_pool: str) -> str:
    return str(((node.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
               or default_pool)


def standby_on_the_way(nodes: Iterable[Obj]) -> dict[str, int]:
    """pool -> GPUs of the standby nodes ClusterWarden added to it that have not arrived."""
    coming: dict[str, int] = {}
    for node in nodes:
        record = record_of(NodeView.of(node).annotations)
        gpus = node_gpus(node)
        if record is not None and record.state == "added" and not arrived(gpus):
            coming[record.pool] = (coming.get(record.pool, 0)
                                   + max(gpus.capacity, gpus.allocatable))
    return coming


def machines_on_the_way(replicas: int, nodes: Iterable[Obj], pool: str,
                        default_pool: str) -> int:
    """How many of a pool's MachineDeployment's replicas have no arrived Node yet."""
    present = 0
    for node in nodes:
        view = NodeView.of(node)
        taken = record_of(view.annotations) is not None
        if (node_pool(node, default_pool) == pool and arrived(node_gpus(node))
                and (taken or not is_standby(view))):
            present += 1
    return max(0, replicas - present)


def net_demand(pool: str, items: int, gpus: int, on_the_way: int) -> PoolDemand:
    """The pool's pending GPUs less those on their way (never below 0); the pods stay
    counted as items, as they still wait."""
    return PoolDemand(pool=pool, items=items, gpus=max(0, gpus - on_the_way),
                      on_the_way=on_the_way)

"""Cluster API Machines of a pool's MachineDeployment, the pure half: which new machines a
scale-up brought (their Nodes are enrolled) and which machines a scale-down removes.

**Scale-up.** After `spec.replicas` grows, Cluster API makes Machines (labelled
`cluster.x-k8s.io/deployment-name=<pool>`) whose Nodes join the cluster (`status.nodeRef`).
The step waits for them and records on each new Machine, in `clusterwarden.io/capacity`, which
task and step added it (the standby pool's record, `state: added`): a resend counts the
machines carrying its own record, and a scale-down knows which machines ClusterWarden added.

**Scale-down.** Cluster API would pick the machines to delete by its delete policy. Instead
ClusterWarden marks the ones it wants gone with `cluster.x-k8s.io/delete-machine` (the task and
step as its value), which Cluster API deletes first, then lowers the replicas by as many:
machines whose Node runs no GPU pod first, then those ClusterWarden added, then the fewest GPU
pods, the newest first. A machine someone else marked, or one already being deleted, is left
to them. A resend finds the machines its step marked and marks no more.

Every write carries the Machine's resourceVersion: a machine changed meanwhile is re-read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.kubernetes import CAPACITY_ANNOTATION, DELETE_MACHINE_ANNOTATION
from services.backends.base import StepRef
from services.backends.kubernetes.capacity import CapacityRecord, record_of


@dataclass(frozen=True)
class MachineView:
    """The parts of a Machine the choices read, as the API server last answered them."""

    name: str
    resource_version: str
    node: str | None
    """The Node the machine became (`status.nodeRef.name`); None while it is being made."""
    created: str
    """Its creationTimestamp (RFC 3339: ordered as text)."""
    deleting: bool
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> MachineView:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        node_ref = status.get("nodeRef") or {}
        return cls(name=meta["name"], resource_version=meta.get("resourceVersion", ""),
                   node=node_ref.get("name") or None,
                   created=str(meta.get("creationTimestamp") or ""),
                   deleting=bool(meta.get("deletionTimestamp")),
                   annotations=dict(meta.get("annotations") or {}))

    @property
    def record(self) -> CapacityRecord | None:
        return record_of(self.annotations)

    @property
    def mark(self) -> str | None:
        return self.annotations.get(DELETE_MACHINE_ANNOTATION)


def mark_of(step: StepRef) -> str:
    """The delete annotation's value: which task and step asked for the machine to go."""
    return f"{step.task_id}/{step.step}"


def _newest_first(machines: Iterable[MachineView]) -> list[MachineView]:
    ordered = sorted(machines, key=lambda m: m.name)
    return sorted(ordered, key=lambda m: m.created, reverse=True)


# ---------------------------------------------------------------- scale-up


@dataclass(frozen=True)
class Arrivals:
    """What a scale-up step found of its new machines."""

    mine: tuple[MachineView, ...]
    """Machines carrying this step's record (recorded now or by an earlier attempt)."""
    to_record: tuple[MachineView, ...]
    """New machines whose Node has joined: to be recorded as this step's now."""
    waiting: tuple[str, ...]
    """New machines whose Node has not joined yet."""


def arrivals(machines: Iterable[MachineView], step: StepRef, before: set[str],
             joined: set[str], wanted: int) -> Arrivals:
    """Of the pool's machines, those this step added, and which new ones to record now.

    New: not there before the scale-up (`before`; empty on a resend, which has no list of its
    own: then the newest unrecorded machines), not recorded by anyone, not being deleted.
    Only a machine whose Node is in the cluster (`joined`) is recorded, so its Node can be
    enrolled; at most `wanted` in all.
    """
    listed = list(machines)
    mine = tuple(sorted((m for m in listed if (r := m.record) is not None and r.by(step)),
                        key=lambda m: m.name))
    new = [m for m in _newest_first(listed) if m.name not in before and m.record is None
           and not m.deleting and m.mark is None]
    room = max(0, wanted - len(mine))
    ready = [m for m in new if m.node is not None and m.node in joined][:room]
    waiting = [m.name for m in new if m not in ready][:max(0, room - len(ready))]
    return Arrivals(mine, tuple(ready), tuple(waiting))


def record_patch(machine: MachineView, step: StepRef, pool: str) -> dict[str, Any]:
    """The record of the step that added this machine, guarded by its resourceVersion."""
    record = CapacityRecord(task_id=step.task_id, step=step.step, pool=pool)
    return {"metadata": {"resourceVersion": machine.resource_version,
                         "annotations": {CAPACITY_ANNOTATION: record.to_json()}}}


# ---------------------------------------------------------------- scale-down


def removal_rank(machine: MachineView, gpu_pods: Mapping[str, int]) -> tuple[int, int, int]:
    """Smaller goes first: idle (no GPU pod on its Node), then added by ClusterWarden, then the
    fewest GPU pods (a machine with no Node yet is idle)."""
    pods = gpu_pods.get(machine.node, 0) if machine.node else 0
    return (0 if pods == 0 else 1, 0 if machine.record is not None else 1, pods)


def choose_removals(machines: Iterable[MachineView], step: StepRef, count: int,
                    nodes: tuple[str, ...], gpu_pods: Mapping[str, int]) -> tuple[str, ...]:
    """The machines to mark for deletion: those this step marked already, then the best
    ranked free ones up to `count`; `count` 0: every idle one (at least one, as the need
    says the pool runs below its range). `nodes`: only the machines of those Nodes."""
    listed = list(machines)
    resuming = sorted(m.name for m in listed if m.mark == mark_of(step))
    free = [m for m in _newest_first(listed) if m.mark is None and not m.deleting
            and (not nodes or m.node in nodes)]
    free.sort(key=lambda m: removal_rank(m, gpu_pods))
    if count > 0:
        chosen = free[:max(0, count - len(resuming))]
    elif nodes:
        chosen = free
    else:
        chosen = [m for m in free if removal_rank(m, gpu_pods)[0] == 0] or free[:1]
        chosen = chosen if not resuming else []
    return (*resuming, *(m.name for m in chosen))


def mark_patch(machine: MachineView, step: StepRef) -> dict[str, Any] | None:
    """The delete annotation on a machine, guarded by its resourceVersion; None when it is
    not this step's to mark (someone else marked it, or it is being deleted) or already is."""
    if machine.deleting or machine.mark is not None:
        return None
    return {"metadata": {"resourceVersion": machine.resource_version,
                         "annotations": {DELETE_MACHINE_ANNOTATION: mark_of(step)}}}

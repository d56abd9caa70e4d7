"""Capacity on Kubernetes, the pure half: which standby nodes to take or give back, how many
machines to ask a MachineDeployment for, and the patch each write sends (docs/kubernetes.md).

**Standby pool.** A node labelled `clusterwarden.io/standby=true` is kept cordoned until
`add_capacity` uncordons it and records, in the annotation `clusterwarden.io/capacity`, which
task and step took it (`state: added`). `remove_capacity` gives back only nodes carrying that
record: it cordons the node (`state: returning`), drains its GPU pods, then removes the record,
leaving the node cordoned and labelled standby as it found it. The label is the owner's consent
to uncordon; a standby node that is not cordoned (someone uses it), carries ClusterWarden's
offline claim or taint (it is being repaired), or is not Ready is never taken.

**MachineDeployment.** A pool's MachineDeployment (named as the pool, in the cluster's
capacity namespace) has `spec.replicas` patched, with the same record on it: the step, and the
replicas before and after. A resend finds its own record and writes nothing.

Every patch carries the resourceVersion it was decided on: a change made meanwhile is re-read
and decided again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from schemas.kubernetes import (
    CAPACITY_ANNOTATION,
    GPU_COUNT_ANNOTATION,
    POOL_LABEL,
    STANDBY_LABEL,
    TAINT_KEY,
)
from services.backends.base import Outcome, StepRef
from services.backends.kubernetes.gpus import node_gpus
from services.backends.kubernetes.protocol import Decision, NodeView, claim_of

NodeState = Literal["added", "returning"]


@dataclass(frozen=True)
class CapacityRecord:
    """ClusterWarden's record on a node it took from standby: which task and step, for which
    pool, whether the node is in use or going back, and how many nodes the step decided to
    take in all (`asked`; 0: not recorded), so that a resend takes what its first attempt
    decided and did not take, whatever the pods did meanwhile."""

    task_id: str
    step: str
    pool: str
    state: NodeState = "added"
    asked: int = 0

    def by(self, step: StepRef) -> bool:
        return self.task_id == step.task_id and self.step == step.step

    def to_json(self) -> str:
        fields = asdict(self)
        if not self.asked:
            del fields["asked"]  # a machine's or a returning node's record: no count to keep
        return json.dumps(fields, sort_keys=True)


def record_of(annotations: Mapping[str, str]) -> CapacityRecord | None:
    """The capacity record in these annotations, or None (an unreadable one is none)."""
    raw = annotations.get(CAPACITY_ANNOTATION)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        state = data.get("state", "added")
        if state not in ("added", "returning"):
            return None
        return CapacityRecord(task_id=str(data["task_id"]), step=str(data["step"]),
                              pool=str(data["pool"]), state=state,
                              asked=max(0, int(data.get("asked", 0))))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


# ---------------------------------------------------------------- standby nodes: choosing


@dataclass(frozen=True)
class StandbyNode:
    """What choosing a standby node reads of a Node (from the cache)."""

    view: NodeView
    gpus: int
    ready: bool
    gpu_pods: int = 0

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def record(self) -> CapacityRecord | None:
        return record_of(self.view.annotations)

    def serves(self, pool: str) -> bool:
        return self.view.labels.get(POOL_LABEL, pool) == pool

    @classmethod
    def of(cls, node: Mapping[str, Any], gpu_pods: int = 0) -> StandbyNode:
        gpus = node_gpus(node)
        return cls(view=NodeView.of(node), gpus=gpus.allocatable, ready=gpus.ready,
                   gpu_pods=gpu_pods)


def is_standby(node: NodeView) -> bool:
    return node.labels.get(STANDBY_LABEL) == "true"


def why_not_free(node: StandbyNode) -> str | None:
    """Why a standby node may not be taken now (None: it may)."""
    view = node.view
    if not is_standby(view):
        return f"node {view.name} is not labelled {STANDBY_LABEL}=true"
    if (record := node.record) is not None:
        return f"node {view.name} was already added by task {record.task_id} step {record.step}"
    if claim_of(view) is not None or any(t.get("key") == TAINT_KEY for t in view.taints):
        return f"node {view.name} is offline (being repaired)"
    if not view.unschedulable:
        return f"standby node {view.name} is not cordoned: someone else uses it"
    if not node.ready:
        return f"standby node {view.name} is not Ready"
    return None


def gpus_to_cover(pending_gpus: int, sizes: Iterable[int]) -> int:
    """How many of the nodes (their GPUs, in the order given) cover the pending GPUs: at
    least one, as a scale need with no queued pod still asks for a node."""
    covered, taken = 0, 0
    for gpus in sizes:
        if taken and covered >= pending_gpus:
            break
        covered += gpus
        taken += 1
    return max(taken, 1)


class StandbyChoice(NamedTuple):
    """What `add_capacity` takes from standby: the nodes this step took already, the free
    ones to take now, and how many the step asks in all (recorded on each node it takes)."""

    mine: tuple[str, ...]
    take: tuple[str, ...]
    asked: int


def choose_standby(nodes: Iterable[StandbyNode], pool: str, step: StepRef, count: int,
                   shortfall_gpus: int) -> StandbyChoice:
    """The step's choice of standby nodes.

    `count` > 0 asks that many in all. 0 asks, on the step's first attempt, enough for the
    pool's shortfall: its pending GPUs less those already on their way (at least one node, as
    a scale need with no queued pod still asks for one); a resend asks what the first attempt
    recorded, since pods may have moved onto its nodes meanwhile. Largest first, then by
    name: the fewest nodes for the demand, the same choice each time.
    """
    listed = list(nodes)
    records = {n.name: r for n in listed if (r := n.record) is not None and r.by(step)
               and r.state == "added"}
    mine = tuple(sorted(records))
    free = sorted((n for n in listed if n.serves(pool) and why_not_free(n) is None),
                  key=lambda n: (-n.gpus, n.name))
    if count > 0:
        asked = count
    elif mine:
        asked = max(max(r.asked for r in records.values()), len(mine))
    else:
        asked = gpus_to_cover(shortfall_gpus, (n.gpus for n in free))
    more = max(0, asked - len(mine))
    return StandbyChoice(mine, tuple(n.name for n in free[:more]), asked)


def choose_returns(nodes: Iterable[StandbyNode], pool: str, step: StepRef,
                   names: tuple[str, ...], count: int) -> tuple[str, ...]:
    """The nodes to give back to standby: those this step is already returning, then of the
    nodes ClusterWarden added to the pool (only `names` if given), those with the fewest GPU
    pods (the least to evict) up to `count` (0: every one with no GPU pod)."""
    listed = list(nodes)
    resuming = sorted(n.name for n in listed if (r := n.record) is not None and r.by(step)
                      and r.state == "returning")
    added = [n for n in listed if (r := n.record) is not None and r.state == "added"
             and r.pool == pool and (not names or n.name in names)]
    added.sort(key=lambda n: (n.gpu_pods, n.gpus, n.name))
    if count > 0:
        chosen = [n.name for n in added[:max(0, count - len(resuming))]]
    elif names:
        chosen = [n.name for n in added]
    else:
        chosen = [n.name for n in added if n.gpu_pods == 0]
    return (*resuming, *chosen)


# ---------------------------------------------------------------- standby nodes: writes


def _record_patch(node: NodeView, record: CapacityRecord | None,
                  unschedulable: bool | None) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": node.resource_version,
                         "annotations": {CAPACITY_ANNOTATION:
                                         record.to_json() if record else None}},
            "spec": {"unschedulable": unschedulable}}


def decide_take(node: NodeView, step: StepRef, pool: str, ready: bool,
                asked: int = 0) -> Decision:
    """Uncordon a free standby node and record the step (and how many nodes it asks in all),
    decided on the node as re-read."""
    record = record_of(node.annotations)
    if record is not None and record.by(step) and record.state == "added":
        return Decision(Outcome.ALREADY, detail=f"added by this step already: {node.name}")
    if refusal := why_not_free(StandbyNode(node, gpus=0, ready=ready)):
        return Decision(Outcome.REFUSED, detail=refusal)
    taken = CapacityRecord(task_id=step.task_id, step=step.step, pool=pool, asked=asked)
    return Decision(Outcome.APPLIED, patch=_record_patch(node, taken, None))


def taking(step: StepRef, pool: str, ready: bool,
           asked: int = 0) -> Callable[[NodeView], Decision]:
    """`decide_take` for one node, as `nodes.apply` calls a decision."""
    return lambda node: decide_take(node, step, pool, ready, asked)


def decide_return(node: NodeView, step: StepRef) -> Decision:
    """Cordon a node ClusterWarden added, marking it as going back (then drained)."""
    record = record_of(node.annotations)
    if record is None:
        return Decision(Outcome.REFUSED,
                        detail=f"node {node.name} was not added by ClusterWarden")
    if record.state == "returning" and node.unschedulable:
        return Decision(Outcome.ALREADY, detail=f"node {node.name} is going back already")
    going = CapacityRecord(task_id=step.task_id, step=step.step, pool=record.pool,
                           state="returning")
    return Decision(Outcome.APPLIED, patch=_record_patch(node, going, True))


def decide_release(node: NodeView) -> Decision:
    """The drained node back in standby: cordoned, its record gone."""
    record = record_of(node.annotations)
    if record is None:
        return Decision(Outcome.ALREADY, detail=f"node {node.name} is in standby")
    if record.state != "returning":
        return Decision(Outcome.REFUSED, detail=f"node {node.name} is in use again "
                                                f"(added by task {record.task_id})")
    return Decision(Outcome.APPLIED, patch=_record_patch(node, None, True))


# ---------------------------------------------------------------- MachineDeployments


@dataclass(frozen=True)
class MachineDeploymentView:
    namespace: str
    name: str
    resource_version: str
    replicas: int
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> MachineDeploymentView:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return cls(namespace=meta.get("namespace", ""), name=meta["name"],
                   resource_version=meta.get("resourceVersion", ""),
                   replicas=int(spec.get("replicas") or 0),
                   annotations=dict(meta.get("annotations") or {}))

    @property
    def gpus_per_machine(self) -> int:
        try:
            return max(int(self.annotations.get(GPU_COUNT_ANNOTATION, "0")), 0)
        except ValueError:
            return 0


@dataclass(frozen=True)
class ScaleRecord:
    """ClusterWarden's record on a MachineDeployment it scaled: the step, replicas before and
    after (a resend answers these, not a second scaling)."""

    task_id: str
    step: str
    before: int
    after: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def scale_record_of(annotations: Mapping[str, str]) -> ScaleRecord | None:
    raw = annotations.get(CAPACITY_ANNOTATION)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return ScaleRecord(task_id=str(data["task_id"]), step=str(data["step"]),
                           before=int(data["before"]), after=int(data["after"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class ScaleDecision:
    outcome: Outcome
    before: int
    after: int
    patch: dict[str, Any] | None = None


def machines_for(count: int, shortfall_gpus: int, gpus_per_machine: int) -> int:
    """How many machines to add: `count` if set, else enough for the pool's shortfall (its
    pending GPUs less those on their way; at least one, one when the machines' size is
    unknown)."""
    if count > 0:
        return count
    if gpus_per_machine <= 0:
        return 1
    return max(1, math.ceil(shortfall_gpus / gpus_per_machine))


def decide_scale(md: MachineDeploymentView, step: StepRef, delta: int) -> ScaleDecision:
    """Replicas moved by `delta` (never below zero) with the step recorded; a resend of the
    same step finds its record and writes nothing."""
    record = scale_record_of(md.annotations)
    if record is not None and record.task_id == step.task_id and record.step == step.step:
        return ScaleDecision(Outcome.ALREADY, record.before, record.after)
    after = max(0, md.replicas + delta)
    if after == md.replicas:
        return ScaleDecision(Outcome.ALREADY, md.replicas, after)
    mine = ScaleRecord(task_id=step.task_id, step=step.step, before=md.replicas, after=after)
    patch = {"metadata": {"resourceVersion": md.resource_version,
                          "annotations": {CAPACITY_ANNOTATION: mine.to_json()}},
             "spec": {"replicas": after}}
    return ScaleDecision(Outcome.APPLIED, md.replicas, after, patch)

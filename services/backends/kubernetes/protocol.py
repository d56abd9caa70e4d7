"""What ClusterWarden writes on a Kubernetes node, and whether it may: pure decisions.

The protocol (docs/kubernetes.md): offline cordons the node, adds the taint
`clusterwarden.io/unhealthy=<reason>` and records in the annotation `clusterwarden.io/offline`
which task and step did it, why, and with which effect. That annotation is ClusterWarden's
claim on the node. **One owner per node**: a node cordoned (or carrying our taint key) without
the claim belongs to someone else and is never touched; online undoes only what the claim says
ClusterWarden did. Each patch carries the resourceVersion the decision was made on, so a node
changed meanwhile is re-read and decided again, never overwritten.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.events.v1 import TaintEffect
from schemas.kubernetes import OFFLINE_ANNOTATION, TAINT_KEY
from services.backends.base import Outcome, StepRef

# A taint's value is a label value: at most 63 of these characters, alphanumeric at both ends.
_LABEL_VALUE_MAX = 63
_NOT_LABEL_CHAR = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class NodeView:
    """The parts of a Node the decisions read, as the API server last answered them."""

    name: str
    resource_version: str
    unschedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    """Each taint as the API serialises it (kept whole: a patch rewrites the list)."""
    annotations: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeView:
        """From a Node as serialised JSON (camelCase keys)."""
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        return cls(name=meta["name"], resource_version=meta.get("resourceVersion", ""),
                   unschedulable=bool(spec.get("unschedulable")),
                   taints=tuple(spec.get("taints") or ()),
                   annotations=dict(meta.get("annotations") or {}),
                   labels=dict(meta.get("labels") or {}))


@dataclass(frozen=True)
class Claim:
    """ClusterWarden's record on a node it took offline."""

    task_id: str
    step: str
    reason: str
    effect: TaintEffect

    def to_json(self) -> str:
        return json.dumps({"task_id": self.task_id, "step": self.step, "reason": self.reason,
                           "effect": self.effect}, sort_keys=True)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    patch: dict[str, Any] | None = None
    """A JSON merge patch to send (None: nothing to write)."""
    detail: str = ""


def claim_of(node: NodeView) -> Claim | None:
    """ClusterWarden's claim on the node, or None (an unreadable claim is no claim)."""
    raw = node.annotations.get(OFFLINE_ANNOTATION)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        effect = data["effect"]
        if effect not in ("NoSchedule", "NoExecute"):
            return None
        return Claim(task_id=str(data["task_id"]), step=str(data["step"]),
                     reason=str(data["reason"]), effect=effect)
    except (ValueError, KeyError, TypeError):
        return None


def taint_value(reason: str) -> str:
    """The reason as a valid taint value (the whole reason stays in the claim)."""
    value = _NOT_LABEL_CHAR.sub("-", reason)[:_LABEL_VALUE_MAX].strip("-_.")
    return value or "unhealthy"


def our_taint(reason: str, effect: TaintEffect) -> dict[str, str]:
    return {"key": TAINT_KEY, "value": taint_value(reason), "effect": effect}


def _other_taints(node: NodeView) -> list[Mapping[str, Any]]:
    return [t for t in node.taints if t.get("key") != TAINT_KEY]


def _has_our_taint(node: NodeView) -> bool:
    return any(t.get("key") == TAINT_KEY for t in node.taints)


def owner_refusal(node: NodeView) -> str | None:
    """Why the node is someone else's (None: ClusterWarden may act on it)."""
    if claim_of(node) is not None:
        return None
    if node.unschedulable:
        return f"node {node.name} was cordoned by someone else (no {OFFLINE_ANNOTATION} claim)"
    if _has_our_taint(node):
        return f"node {node.name} carries {TAINT_KEY} set by someone else"
    return None


def decide_offline(node: NodeView, step: StepRef, reason: str,
                   effect: TaintEffect) -> Decision:
    """Cordon + taint + claim, unless the node is already so, or is someone else's."""
    if refusal := owner_refusal(node):
        return Decision(Outcome.REFUSED, detail=refusal)
    wanted = our_taint(reason, effect)
    current = [t for t in node.taints if t.get("key") == TAINT_KEY]
    claim = claim_of(node)
    same_taint = any(t.get("effect") == effect for t in current) and len(current) == 1
    if claim is not None and claim.effect == effect and node.unschedulable and same_taint:
        return Decision(Outcome.ALREADY,
                        detail=f"offline since task {claim.task_id} step {claim.step}")
    claim = Claim(task_id=step.task_id, step=step.step, reason=reason, effect=effect)
    patch = {
        "metadata": {"resourceVersion": node.resource_version,
                     "annotations": {OFFLINE_ANNOTATION: claim.to_json()}},
        "spec": {"unschedulable": True, "taints": [*_other_taints(node), wanted]},
    }
    return Decision(Outcome.APPLIED, patch=patch)


def decide_online(node: NodeView) -> Decision:
    """Undo what ClusterWarden's claim says it did, and nothing a person did."""
    claim = claim_of(node)
    if claim is None:
        if refusal := owner_refusal(node):
            return Decision(Outcome.REFUSED, detail=refusal)
        return Decision(Outcome.ALREADY, detail=f"node {node.name} is not offline")
    patch = {
        "metadata": {"resourceVersion": node.resource_version,
                     "annotations": {OFFLINE_ANNOTATION: None}},
        "spec": {"unschedulable": None, "taints": _other_taints(node) or None},
    }
    return Decision(Outcome.APPLIED, patch=patch,
                    detail=f"undoing task {claim.task_id} step {claim.step}")


def decide_drain_cordon(node: NodeView, step: StepRef, reason: str) -> Decision:
    """A drain's first write: the node cordoned and claimed before any eviction, so no
    replacement lands back on it. A node already claimed keeps its claim (and its effect);
    someone else's node is refused, so it is never drained."""
    claim = claim_of(node)
    if claim is not None:
        return decide_offline(node, StepRef(claim.task_id, claim.step), claim.reason,
                              claim.effect)
    return decide_offline(node, step, reason, "NoSchedule")

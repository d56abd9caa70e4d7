"""A Kubernetes node's conditions as fault data (pure): what the agent on the node reports
beside its GPU readings (docs/kubernetes.md, "Node conditions as fault data").

The kubelet keeps the Node's `Ready` condition; node-problem-detector-style tools add their
own (`KernelDeadlock`, `ReadonlyFilesystem`, a GPU health checker's `GPUProblem`), True while
the problem lasts. Each is one `node_condition` fault, which the analyzer's fault range (any
fault above 0) turns into the offline need:

* `Ready` False or Unknown, once it has been so for `not_ready_after_s` (a node joining the
  cluster is NotReady while its network comes up; a Node that says nothing yet is no fault);
* every condition named in `faulty` that is True.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas.envelope import short_text
from schemas.events.v1 import Fault

# node-problem-detector's default problem conditions, and the GPU one its custom plugins and
# GPU health checkers set.
DEFAULT_FAULTY = ("GPUProblem", "KernelDeadlock", "ReadonlyFilesystem",
                  "FrequentKubeletRestart", "FrequentContainerdRestart",
                  "FrequentDockerRestart", "CorruptDockerOverlay2")


@dataclass(frozen=True)
class ConditionRule:
    """Which of a Node's conditions are faults."""

    faulty: tuple[str, ...] = DEFAULT_FAULTY
    not_ready_after_s: float = 30.0


def _since(condition: Mapping[str, Any]) -> datetime | None:
    raw = condition.get("lastTransitionTime")
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None


def _fault(condition: Mapping[str, Any]) -> Fault:
    said = ": ".join(str(p) for p in (condition.get("reason"), condition.get("message")) if p)
    detail = f"{condition.get('type')}={condition.get('status')}" + (f": {said}" if said else "")
    return Fault(kind="node_condition", detail=short_text(detail))


def condition_faults(node: Mapping[str, Any] | None, rule: ConditionRule,
                     now: datetime) -> list[Fault]:
    """The Node's conditions that are faults now, in the order the Node lists them."""
    faults: list[Fault] = []
    for condition in ((node or {}).get("status") or {}).get("conditions") or ():
        kind, status = condition.get("type"), condition.get("status")
        if kind == "Ready" and status in ("False", "Unknown"):
            since = _since(condition)
            if since is None or (now - since).total_seconds() >= rule.not_ready_after_s:
                faults.append(_fault(condition))
        elif kind in rule.faulty and status == "True":
            faults.append(_fault(condition))
    return faults

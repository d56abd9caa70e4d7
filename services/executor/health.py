"""Whether a node may return to service: the health check an online step names, decided purely.

The template's `health_check` (schemas `HealthCheck`) asks two things: the backend's view of
the node is clear (on Kubernetes: the `Ready` condition True and no other condition True;
node-problem-detector-style conditions such as `GPUProblem` or `KernelDeadlock` are problems
when True, as are `MemoryPressure`, `DiskPressure`, `PIDPressure`, `NetworkUnavailable`), and
its agent, as the collector keeps it in Redis, has reported no fault for `hold_s`. The online
step asks again until both hold or its time runs out; nothing here reads a clock or a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas.events.v1 import HealthCheck

# A silent agent proves nothing about the node's health.
_SILENT_STATES = ("suspect", "down")
# How soon to ask again when nothing says when the answer could change (a condition clears
# whenever its reporter says so).
RECHECK_S = 1.0


@dataclass(frozen=True)
class AgentHealth:
    """The node's agent as the collector last recorded it (services/collector/store.py)."""

    state: str
    fault_count: int
    """Faults in the latest applied report."""
    fault_at: float | None
    """When the latest report that carried a fault was sent (epoch seconds); None: never."""


@dataclass(frozen=True)
class HealthVerdict:
    clear: bool
    reason: str = ""
    """Why the node is not ready yet (empty when clear)."""
    recheck_s: float = RECHECK_S
    """When the answer could change at the earliest."""


def condition_problem(conditions: Mapping[str, str] | None) -> str | None:
    """What in the node's conditions keeps it out (None: clear)."""
    if conditions is None:
        return "the backend does not know the node"
    if conditions.get("Ready") != "True":
        return f"its Ready condition is {conditions.get('Ready', 'missing')}"
    problems = sorted(kind for kind, status in conditions.items()
                      if kind != "Ready" and status == "True")
    if problems:
        return f"its condition{'s' if len(problems) > 1 else ''} {', '.join(problems)} True"
    return None


def judge(check: HealthCheck, conditions: Mapping[str, str] | None,
          agent: AgentHealth | None, now: float) -> HealthVerdict:
    """Clear when every part the check names holds at `now`; else the first reason why not.
    `hold_s` 0 does not consult the agent."""
    if check.conditions_clear and (problem := condition_problem(conditions)) is not None:
        return HealthVerdict(False, problem)
    if check.hold_s <= 0:
        return HealthVerdict(True)
    if agent is None:
        return HealthVerdict(False, "its agent has not reported")
    if agent.state in _SILENT_STATES:
        return HealthVerdict(False, f"its agent is {agent.state} (not reporting)")
    if agent.fault_count > 0:
        return HealthVerdict(False, f"its agent reports {agent.fault_count} fault(s)")
    if agent.fault_at is not None and (quiet := now - agent.fault_at) < check.hold_s:
        return HealthVerdict(False, f"its agent's last fault was {quiet:.0f} s ago "
                                    f"(hold {check.hold_s:g} s)",
                             recheck_s=max(check.hold_s - quiet, 0.0))
    return HealthVerdict(True)

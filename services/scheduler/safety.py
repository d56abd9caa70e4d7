"""Pool safety limits: the short-circuit and the offline budget (docs/reliability.md
§Short-circuit, §Offline budget).

Pure decisions: the pool's latest health and the time are passed in. The budget's in-flight
count lives in Redis; `budget_capacity` gives the limit its atomic admission compares with.
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from schemas.events.v1 import NodeStateName, OpsTask, PoolHealth
from services.scheduler.breaker import DEFAULT_DISRUPTIVE_KINDS

DEFAULT_UNHEALTHY_FRACTION = 0.40
DEFAULT_MAX_AGE_S = 60.0
DEFAULT_BUDGET_FRACTION = 0.10
NO_HEALTH_BUDGET = "no pool health: budget unknown"

# Nodes automation has taken (or is taking) out of service, and nodes not ready for work:
# the `offline` and `notready` terms of the Karpenter budget formula.
OUT_OF_SERVICE_STATES: tuple[NodeStateName, ...] = ("offline", "draining")
NOT_READY_STATES: tuple[NodeStateName, ...] = ("suspect", "down")

# What takes a node out of service, whatever the task's template is called. Not
# remove_capacity: it makes a child task per node (kind remove_node, budgeted), and the
# parent counted too would hold the place its own children wait for.
NODE_REMOVING_ACTIONS: frozenset[str] = frozenset({"drain_node", "offline_node"})
NODE_REMOVING_KIND = "offline"


def safety_kind(task: OpsTask, budget_kinds: tuple[str, ...]) -> str:
    """The kind the pool's short-circuit and offline budget judge a task as: its own, unless
    one of its steps takes a node out of service (drain, offline) and its kind does
    not already spend the budget; then `offline`. The limits follow what the steps do, not
    the label: a template called load_balance that drains a node is held and counted as an
    offline task is."""
    if task.kind in budget_kinds:
        return task.kind
    if any(step.action.action in NODE_REMOVING_ACTIONS for step in task.steps):
        return NODE_REMOVING_KIND
    return task.kind


class Verdict(BaseModel):
    """Whether a task may run now, and why not if it may not."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    allowed: bool
    reason: str = ""
    alert: bool = False


def short_circuit(health: PoolHealth | None, kind: str, now: datetime,
                  max_age_s: float = DEFAULT_MAX_AGE_S,
                  max_unhealthy: float = DEFAULT_UNHEALTHY_FRACTION,
                  disruptive_kinds: tuple[str, ...] = DEFAULT_DISRUPTIVE_KINDS) -> Verdict:
    """Refuse disruptive work in a sick pool, and all work when every node looks sick."""
    disruptive = kind in disruptive_kinds
    if health is None:
        # Fail closed: without a health report we cannot tell a healthy pool from a dying one.
        # The analyzer publishes every pool period, so this only delays work briefly.
        if disruptive:
            return Verdict(allowed=False, reason="no pool health seen yet")
        return Verdict(allowed=True)
    age_s = (now - health.occurred_at).total_seconds()
    if age_s > max_age_s:
        if disruptive:
            return Verdict(allowed=False, alert=True,
                           reason=f"pool health is {age_s:.0f} s old (max {max_age_s:.0f} s)")
        return Verdict(allowed=True)
    if health.nodes_total > 0 and health.unhealthy_fraction >= 1.0:
        # Kubernetes' rule: when every node looks unhealthy the fault is more likely in the
        # monitoring or the network than in the nodes, so nothing automatic runs at all.
        return Verdict(allowed=False, alert=True,
                       reason="every node looks unhealthy: assuming a monitoring fault")
    if disruptive and health.unhealthy_fraction > max_unhealthy:
        return Verdict(allowed=False, alert=True,
                       reason=f"{health.unhealthy_fraction:.0%} of pool {health.pool} unhealthy "
                              f"(> {max_unhealthy:.0%}): no automatic {kind}")
    return Verdict(allowed=True)


def budget_capacity(health: PoolHealth, fraction: float = DEFAULT_BUDGET_FRACTION,
                    target_not_ready: bool = False) -> int:
    """How many budgeted tasks may be in flight in the pool at once (may be 0 or less).

    roundup(fraction * nodes) - offline - notready (the Karpenter formula). A target that is
    itself suspect or down is already counted among the not-ready nodes: taking it offline
    removes no working capacity, so it is given back (otherwise, in a pool under 10 nodes, a
    dead node would block its own repair).
    """
    states = health.nodes_by_state
    out = sum(states.get(s, 0) for s in OUT_OF_SERVICE_STATES)
    not_ready = sum(states.get(s, 0) for s in NOT_READY_STATES)
    # Rounded before ceil so 0.1 * 30 is 3, not 4 by float error.
    allowed = math.ceil(round(fraction * health.nodes_total, 9))
    return allowed - out - not_ready + (1 if target_not_ready else 0)


def offline_budget(health: PoolHealth, in_flight_offline: int,
                   fraction: float = DEFAULT_BUDGET_FRACTION) -> int:
    """Nodes automation may still take offline: roundup(fraction * nodes) - offline - notready.

    `in_flight_offline` (dispatched budgeted tasks not yet finished) is taken off too, since
    their nodes may not show as draining yet; never below 0.
    """
    return max(0, budget_capacity(health, fraction) - in_flight_offline)


def admits_offline(health: PoolHealth | None, in_flight_offline: int,
                   fraction: float = DEFAULT_BUDGET_FRACTION,
                   target_not_ready: bool = False) -> Verdict:
    """Whether one more budgeted task fits the pool's budget (see `budget_capacity`)."""
    if health is None:
        return Verdict(allowed=False, reason=NO_HEALTH_BUDGET)
    if in_flight_offline < budget_capacity(health, fraction, target_not_ready):
        return Verdict(allowed=True)
    return budget_used_up(health.pool, in_flight_offline)


def budget_used_up(pool: str, in_flight: int) -> Verdict:
    return Verdict(allowed=False, reason=f"offline budget of pool {pool} used up "
                                         f"({in_flight} in flight)")

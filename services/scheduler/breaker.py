"""The circuit breaker per (cluster, action type): pure decisions, time passed in.

A window of the last outcomes, bounded in count and in time (an outcome older than
`window_s` no longer counts), trips the breaker on a failure rate or on a run of
consecutive failures (docs/reliability.md §Circuit breaker). Disruptive action types stay
OPEN until an audited admin reset; the others get one half-open trial after a wait.

The action type is `OpsTask.kind` (a child task's action type, else its need kind). A
kind's scope says what its failures stop:

- `kind`: that kind in its cluster (the breaker is named `<kind>`);
- `node`: every task targeting the failing node, and ML tasks routed to it
  (`<kind>@<node>`);
- `cluster`: every task of the cluster (`<kind>@*`); detection and records go on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import BreakerScope as BreakerScope

# The names' grammar lives with the hold set the router reads too (re-exported here).
from services.shared.breaker_holds import SCOPE_SEPARATOR as SCOPE_SEPARATOR
from services.shared.breaker_holds import WHOLE_CLUSTER as WHOLE_CLUSTER

Status = Literal["CLOSED", "OPEN", "HALF_OPEN"]

# What a task's kind does to a cluster: anything that drains, migrates or removes a node is
# disruptive, so a breaker of that kind is never closed by a trial run. `migrate` and
# `remove_node` are the action types of the child tasks that move jobs and remove nodes.
DEFAULT_DISRUPTIVE_KINDS: tuple[str, ...] = (
    "offline", "scale_in", "load_balance", "migrate", "remove_node")

SCOPES: tuple[BreakerScope, ...] = ("kind", "node", "cluster")

_FROZEN = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class BreakerConfig(BaseModel):
    """The limits of one breaker."""

    model_config = _FROZEN

    window: Annotated[int, Field(ge=1, le=1_000)] = 10
    min_calls: Annotated[int, Field(ge=1, le=1_000)] = 3
    failure_rate_pct: Annotated[float, Field(gt=0.0, le=100.0)] = 50.0
    consecutive_failures: Annotated[int, Field(ge=1, le=1_000)] = 3
    window_s: Annotated[float, Field(gt=0.0, le=30 * 86_400.0)] = 3_600.0
    wait_s: Annotated[float, Field(ge=0.0, le=86_400.0)] = 60.0
    max_half_open_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 1_800.0
    disruptive: bool = False


class Outcome(BaseModel):
    """How one task of the breaker's kind ended."""

    model_config = _FROZEN

    task_id: str
    failed: bool


class BreakerState(BaseModel):
    """Everything a breaker remembers; persisted field by field."""

    model_config = _FROZEN

    status: Status = "CLOSED"
    window: tuple[bool, ...] = Field(default=(), description="True = failure, oldest first.")
    window_at: tuple[float, ...] = Field(
        default=(), description="When each outcome of `window` was recorded (the newest "
        "aligned); an outcome without a time (kept before times were) no longer counts.")
    consecutive_failures: Annotated[int, Field(ge=0)] = 0
    opened_at: float | None = None
    openings: Annotated[int, Field(ge=0)] = Field(
        default=0, description="How often it opened: one alert per opening."
    )
    trial_task: str = ""
    trial_at: float | None = None


class Decision(BaseModel):
    """Whether a task of the breaker's kind may be dispatched now."""

    model_config = _FROZEN

    allowed: bool
    reason: str
    half_open_trial: bool = False


def breaker_name(kind: str, target: str, scope: BreakerScope) -> str:
    """The breaker a task of `kind` on `target` counts against, within its cluster.

    Per node, one bad node trips only its own breaker and stops only that node; per cluster,
    any kind's failures stop everything: the scope is set per kind (and per template).
    """
    if scope == "node":
        return f"{kind}{SCOPE_SEPARATOR}{target}"
    if scope == "cluster":
        return f"{kind}{SCOPE_SEPARATOR}{WHOLE_CLUSTER}"
    return kind


def breaker_named(kind: str, node: str | None = None, scope: BreakerScope | None = None) -> str:
    """The breaker an operator names by `kind` (a task kind, or `kind@node` / `kind@*` as the
    breaker list shows it), an optional node and an optional scope; ValueError when they
    disagree."""
    base, _, at = kind.partition(SCOPE_SEPARATOR)
    if at and node and at != node:
        raise ValueError(f"{kind} names another node than {node}")
    target = node or at
    if not target and scope == "cluster":
        target = WHOLE_CLUSTER
    named: BreakerScope = ("cluster" if target == WHOLE_CLUSTER else
                           "node" if target else "kind")
    if scope is not None and scope != named:
        raise ValueError(f"{kind} (node {node or '-'}) is not a {scope}-scoped breaker")
    return breaker_name(base, target, named)


def kind_of(name: str) -> str:
    """The task kind of a breaker name (`offline@node-1` -> `offline`)."""
    return name.partition(SCOPE_SEPARATOR)[0]


def scope_of(name: str) -> BreakerScope:
    """The scope of a breaker name (`offline`: kind, `offline@n1`: node, `offline@*`: cluster)."""
    target = name.partition(SCOPE_SEPARATOR)[2]
    return "kind" if not target else "cluster" if target == WHOLE_CLUSTER else "node"


def node_of(name: str) -> str | None:
    """The node a node-scoped breaker stops, else None."""
    return name.partition(SCOPE_SEPARATOR)[2] if scope_of(name) == "node" else None


def holds_beyond_its_kind(name: str) -> bool:
    """True for the breakers that, open, stop more than their own kind (node, cluster)."""
    return scope_of(name) != "kind"


def blocking(holding: set[str], own: str, target: str) -> str | None:
    """Of the node- and cluster-scoped breakers not closed (`holding`), the one that holds back
    a task counting against breaker `own` and targeting `target`; None if none does.

    The task's own breaker is not one of them: it decides by `admits`, half-open trial and all.
    """
    for name in sorted(holding - {own}):
        if scope_of(name) == "cluster" or node_of(name) == target:
            return name
    return None


def _opened(state: BreakerState, now: float) -> BreakerState:
    return BreakerState(status="OPEN", window=state.window, window_at=state.window_at,
                        consecutive_failures=state.consecutive_failures, opened_at=now,
                        openings=state.openings + 1)


def recent(state: BreakerState, now: float, config: BreakerConfig) -> list[tuple[bool, float]]:
    """The outcomes that still count at `now`, oldest first, as (failed, at): those of the
    last `window_s` seconds, at most as many as the rate or the run of failures looks at."""
    kept = max(config.window, config.consecutive_failures)
    # Aligned from the newest: an outcome stored without a time has none here and is dropped.
    paired = list(zip(reversed(state.window), reversed(state.window_at), strict=False))[::-1]
    return [(failed, at) for failed, at in paired if now - at <= config.window_s][-kept:]


def trailing_failures(outcomes: list[tuple[bool, float]]) -> int:
    """How many of `outcomes` at the end are failures in a row."""
    run = 0
    for failed, _ in reversed(outcomes):
        if not failed:
            break
        run += 1
    return run


def trips(window: tuple[bool, ...], consecutive: int, config: BreakerConfig) -> bool:
    """True if the window's failure rate or the run of consecutive failures is at a limit."""
    if consecutive >= config.consecutive_failures:
        return True
    if len(window) < config.min_calls:
        return False
    return 100.0 * sum(window) / len(window) >= config.failure_rate_pct


def record(state: BreakerState, outcome: Outcome, now: float,
           config: BreakerConfig) -> BreakerState:
    """The state after a task of this breaker's kind ended."""
    if state.status == "OPEN":
        # Tasks dispatched before the breaker opened may still finish; they cannot close it.
        return state
    if state.status == "HALF_OPEN":
        if outcome.task_id != state.trial_task:
            return state  # a late result from before the breaker opened, not the trial
        if outcome.failed:
            return _opened(state, now)
        return BreakerState(openings=state.openings)
    outcomes = [*recent(state, now, config), (outcome.failed, now)]
    outcomes = outcomes[-max(config.window, config.consecutive_failures):]
    consecutive = trailing_failures(outcomes)
    window = tuple(failed for failed, _ in outcomes[-config.window:])
    closed = BreakerState(window=tuple(failed for failed, _ in outcomes),
                          window_at=tuple(at for _, at in outcomes),
                          consecutive_failures=consecutive, openings=state.openings)
    return _opened(closed, now) if trips(window, consecutive, config) else closed


def admits(state: BreakerState, now: float, config: BreakerConfig) -> Decision:
    """Whether a task may run; `half_open_trial` means it is the one trial (see `begin_trial`)."""
    if state.status == "CLOSED":
        return Decision(allowed=True, reason="closed")
    if config.disruptive:
        return Decision(allowed=False, reason="open until an admin reset (disruptive)")
    if state.status == "HALF_OPEN":
        if state.trial_at is not None and now - state.trial_at >= config.max_half_open_s:
            # The trial never reported back; another one is the only way out of half-open.
            return Decision(allowed=True, reason="half-open trial (previous one lost)",
                            half_open_trial=True)
        return Decision(allowed=False, reason="half-open trial in flight")
    waited = now - (state.opened_at if state.opened_at is not None else now)
    if waited >= config.wait_s:
        return Decision(allowed=True, reason="half-open trial", half_open_trial=True)
    return Decision(allowed=False, reason=f"open; half-open in {config.wait_s - waited:.0f} s")


def begin_trial(state: BreakerState, task_id: str, now: float) -> BreakerState:
    """The state once `task_id` was admitted as the half-open trial."""
    return state.model_copy(update={"status": "HALF_OPEN", "trial_task": task_id,
                                    "trial_at": now})


def release_trial(state: BreakerState, task_id: str) -> BreakerState:
    """The state once `task_id` will not be the trial after all: it ended without an outcome
    that counts (the agent refused it), or a later limit (budget, rate) held it in the queue.

    If it was the half-open trial the breaker goes back to open, keeping when it opened, so the
    next task is offered a trial at once instead of after the half-open limit.
    """
    if state.status != "HALF_OPEN" or state.trial_task != task_id:
        return state
    return state.model_copy(update={"status": "OPEN", "trial_task": "", "trial_at": None})


def reset(state: BreakerState) -> BreakerState:
    """An admin's reset: closed with an empty window (the caller audits who and why)."""
    return BreakerState(openings=state.openings)

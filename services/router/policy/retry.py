"""Retry plan by attributed cause, within a retry budget (docs/routing-policy.md §Retries)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from services.router.policy.attribution import Cause
from services.router.policy.config import DEFAULT_CONFIG, SelectorConfig
from services.router.policy.stats import arm_key


@dataclass(frozen=True, slots=True)
class Avoid:
    """What the next attempt should not use; the selector relaxes it rather than fail."""

    arms: frozenset[str] = frozenset()     # arm keys (`arm:<model>@<node>`)
    nodes: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, list[str]]:
        return {"arms": sorted(self.arms), "nodes": sorted(self.nodes),
                "models": sorted(self.models)}

    @classmethod
    def from_dict(cls, data: dict[str, list[str]]) -> Avoid:
        return cls(arms=frozenset(data.get("arms", ())), nodes=frozenset(data.get("nodes", ())),
                   models=frozenset(data.get("models", ())))


@dataclass(frozen=True, slots=True)
class Task:
    """The task being routed. `deadline` is absolute, on the same clock as `now`."""

    task_id: str
    task_type: str
    priority: int = 5
    deadline: float | None = None
    critical: bool = False
    attempt: int = 1
    avoid: Avoid = field(default_factory=Avoid)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One finished attempt of a task."""

    model: str
    node: str
    family: str
    cause: Cause


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Retries in flight and active tasks of the task type, now (Envoy retry budget)."""

    retries_in_flight: int = 0
    active_tasks: int = 0


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """Whether to try again and where not to; `next_task` is the task for the next select."""

    retry: bool
    reason: str
    avoid: Avoid
    next_task: Task | None


# Per cause: (retry at all, avoid the node, avoid the model). The arm tried is always
# avoided. Bad input fails anywhere; a deadline too short stays too short.
_BY_CAUSE: dict[Cause, tuple[bool, bool, bool]] = {
    "ok": (False, False, False),
    "node_fault": (True, True, False),
    "model_fault": (True, False, True),
    "timeout": (True, True, True),
    "unknown": (True, True, True),
    "capacity": (True, False, False),
    "bad_input": (False, False, False),
    "deadline_too_short": (False, False, False),
}


def retry_plan(task: Task, cause: Cause, attempts: Sequence[Attempt], budget: RetryBudget,
               *, now: float | None = None,
               config: SelectorConfig = DEFAULT_CONFIG) -> RetryPlan:
    """Retry on a different model or node by cause, within `max_retries`, the deadline and
    the budget (retries in flight < max(min_retry_concurrency, fraction x active tasks)).

    `attempts` are the task's finished attempts, the last one being the one that failed
    with `cause`; the avoid set accumulates over all of them.
    """
    avoid = task.avoid
    for tried in attempts:
        again, node, model = _BY_CAUSE[tried.cause]
        diversify = config.diversify_retries
        avoid = Avoid(arms=avoid.arms | {arm_key(tried.model, tried.node)},
                      nodes=avoid.nodes | ({tried.node} if node and diversify else set()),
                      models=avoid.models | ({tried.model} if model and diversify else set()))
    again = _BY_CAUSE[cause][0]
    if not again:
        return RetryPlan(False, f"no retry: {cause}", avoid, None)
    retries_done = max(len(attempts) - 1, task.attempt - 1)
    if retries_done >= config.max_retries:
        return RetryPlan(False, f"no retry: {retries_done} of {config.max_retries} used",
                         avoid, None)
    if now is not None and task.deadline is not None and now >= task.deadline:
        return RetryPlan(False, "no retry: deadline passed", avoid, None)
    allowed = max(config.min_retry_concurrency,
                  int(config.retry_budget_fraction * budget.active_tasks))
    if budget.retries_in_flight >= allowed:
        return RetryPlan(False, f"no retry: budget {budget.retries_in_flight}/{allowed} "
                         "retries in flight", avoid, None)
    what = {"node_fault": "another node", "model_fault": "another model",
            "capacity": "another arm"}.get(cause, "another model and node")
    nxt = replace(task, attempt=task.attempt + 1, avoid=avoid)
    return RetryPlan(True, f"retry {retries_done + 1}/{config.max_retries} on {what} "
                     f"after {cause}", avoid, nxt)

"""The retry plan: another node or model by cause, within the count, deadline and budget."""

from __future__ import annotations

import pytest

from services.router.policy.attribution import Cause
from services.router.policy.config import SelectorConfig
from services.router.policy.retry import Attempt, RetryBudget, Task, retry_plan
from services.router.policy.stats import arm_key

TASK = Task("t1", "classify", deadline=100.0)
ARM = arm_key("a:v1", "n1")


@pytest.mark.parametrize(
    ("cause", "retry", "nodes", "models"),
    [
        ("node_fault", True, {"n1"}, set()),
        ("model_fault", True, set(), {"a:v1"}),
        ("timeout", True, {"n1"}, {"a:v1"}),
        ("unknown", True, {"n1"}, {"a:v1"}),
        ("capacity", True, set(), set()),
        ("bad_input", False, set(), set()),
        ("deadline_too_short", False, set(), set()),
        ("ok", False, set(), set()),
    ],
)
def test_retry_plan_by_cause(cause: Cause, retry: bool, nodes: set[str],
                             models: set[str]) -> None:
    plan = retry_plan(TASK, cause, [Attempt("a:v1", "n1", "alpha", cause)], RetryBudget(),
                      now=1.0)
    assert plan.retry is retry
    assert plan.avoid.arms == {ARM}
    assert plan.avoid.nodes == nodes
    assert plan.avoid.models == models
    if retry:
        assert plan.next_task is not None
        assert plan.next_task.attempt == 2
        assert plan.next_task.avoid == plan.avoid
    else:
        assert plan.next_task is None


def test_avoid_accumulates_over_attempts_and_retries_are_bounded() -> None:
    attempts = [Attempt("a:v1", "n1", "alpha", "node_fault"),
                Attempt("b:v1", "n2", "alpha", "model_fault")]
    plan = retry_plan(Task("t", "classify", attempt=2), "model_fault", attempts, RetryBudget())
    assert plan.retry
    assert plan.avoid.nodes == {"n1"}
    assert plan.avoid.models == {"b:v1"}
    attempts.append(Attempt("c:v1", "n3", "beta", "timeout"))
    plan = retry_plan(Task("t", "classify", attempt=3), "timeout", attempts, RetryBudget())
    assert not plan.retry
    assert "2 of 2" in plan.reason


def test_no_retry_after_the_deadline() -> None:
    plan = retry_plan(TASK, "node_fault", [Attempt("a:v1", "n1", "alpha", "node_fault")],
                      RetryBudget(), now=100.0)
    assert not plan.retry
    assert "deadline" in plan.reason


def test_retry_budget_stops_storms() -> None:
    one = [Attempt("a:v1", "n1", "alpha", "node_fault")]
    # at most max(3, 20 % of active tasks) retries in flight
    assert retry_plan(TASK, "node_fault", one, RetryBudget(2, 5)).retry
    assert not retry_plan(TASK, "node_fault", one, RetryBudget(3, 5)).retry
    assert retry_plan(TASK, "node_fault", one, RetryBudget(19, 100)).retry
    assert not retry_plan(TASK, "node_fault", one, RetryBudget(20, 100)).retry


def test_undiversified_retries_only_avoid_the_arm() -> None:
    config = SelectorConfig(diversify_retries=False)
    plan = retry_plan(TASK, "node_fault", [Attempt("a:v1", "n1", "alpha", "node_fault")],
                      RetryBudget(), config=config)
    assert plan.avoid.arms == {ARM}
    assert not plan.avoid.nodes

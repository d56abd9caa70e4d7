"""Table tests of the pool short-circuit and the offline budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from schemas.events.v1 import MigrateJobs, NodeStateName, OpsTask, PoolHealth, RemoveCapacity, Step
from services.scheduler.safety import admits_offline, offline_budget, safety_kind, short_circuit
from tests.contracts.examples import example

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def health(states: dict[NodeStateName, int], age_s: float = 0.0) -> PoolHealth:
    """A pool's health as the analyzer computes it, `age_s` seconds before NOW."""
    total = sum(states.values())
    counted = total - states.get("offline", 0)
    unhealthy = states.get("suspect", 0) + states.get("down", 0)
    return PoolHealth(
        event_id=uuid4(), source="analyzer", occurred_at=NOW - timedelta(seconds=age_s),
        cluster_id="c1", subject="default", pool="default", nodes_total=total,
        nodes_by_state=states, unhealthy_fraction=unhealthy / counted if counted else 0.0,
        gpu_utilization_pct=50.0, effective_utilization_pct=50.0,
    )


HEALTHY = health({"up": 10})
SICK = health({"up": 5, "down": 5})  # 50%
AT_LIMIT = health({"up": 6, "down": 4})  # 40%: not above it
ALL_DOWN = health({"down": 3, "suspect": 1})
STALE = health({"up": 10}, age_s=61.0)
EMPTY = health({})


@pytest.mark.parametrize(
    ("pool", "kind", "allowed", "alert"),
    [
        (HEALTHY, "offline", True, False),
        (HEALTHY, "scale_out", True, False),
        (AT_LIMIT, "offline", True, False),
        (SICK, "offline", False, True),
        (SICK, "scale_in", False, True),
        (SICK, "load_balance", False, True),
        (SICK, "scale_out", True, False),
        (SICK, "online", True, False),
        (ALL_DOWN, "offline", False, True),
        (ALL_DOWN, "online", False, True),
        (ALL_DOWN, "scale_out", False, True),
        (STALE, "offline", False, True),
        (STALE, "online", True, False),
        (health({"up": 10}, age_s=59.0), "offline", True, False),
        (None, "offline", False, False),
        (None, "scale_out", True, False),
        (EMPTY, "scale_out", True, False),
    ],
)
def test_short_circuit(pool: PoolHealth | None, kind: str, allowed: bool, alert: bool) -> None:
    verdict = short_circuit(pool, kind, NOW, max_age_s=60.0)
    assert (verdict.allowed, verdict.alert) == (allowed, alert), verdict.reason
    assert verdict.allowed or verdict.reason


def test_the_threshold_is_configurable() -> None:
    assert short_circuit(SICK, "offline", NOW, max_unhealthy=0.5).allowed
    assert not short_circuit(AT_LIMIT, "offline", NOW, max_unhealthy=0.3).allowed


@pytest.mark.parametrize(
    ("states", "in_flight", "fraction", "budget"),
    [
        ({"up": 10}, 0, 0.10, 1),
        ({"up": 30}, 0, 0.10, 3),  # 0.1 * 30 must not round up to 4
        ({"up": 31}, 0, 0.10, 4),  # roundup
        ({"up": 3}, 0, 0.10, 1),
        ({"up": 10}, 1, 0.10, 0),
        ({"up": 29, "offline": 1}, 0, 0.10, 2),
        ({"up": 27, "draining": 1, "down": 1, "suspect": 1}, 0, 0.10, 0),
        ({"up": 8, "offline": 2}, 0, 0.10, 0),  # never below 0
        ({"up": 1, "offline": 1, "down": 1}, 0, 1.0, 1),
        ({}, 0, 0.10, 0),
    ],
)
def test_offline_budget(states: dict[NodeStateName, int], in_flight: int, fraction: float,
                        budget: int) -> None:
    assert offline_budget(health(states), in_flight, fraction) == budget
    assert admits_offline(health(states), in_flight, fraction).allowed == (budget > 0)


def test_no_health_means_no_budget() -> None:
    assert not admits_offline(None, 0).allowed


def test_a_target_that_is_already_down_does_not_spend_the_budget_again() -> None:
    from schemas.events.v1 import PoolHealth
    from services.scheduler.safety import admits_offline
    from tests.contracts.examples import examples

    three = examples()["pool_health"].model_copy(update={
        "nodes_total": 3, "nodes_by_state": {"up": 2, "down": 1}, "unhealthy_fraction": 1 / 3})
    assert isinstance(three, PoolHealth)
    # roundup(0.1 x 3) = 1, minus the down node: nothing left for a healthy node...
    assert not admits_offline(three, 0).allowed
    # ...but the down node itself may be taken offline: it is out of service already.
    assert admits_offline(three, 0, target_not_ready=True).allowed
    assert not admits_offline(three, 1, target_not_ready=True).allowed


def test_the_limits_judge_a_task_by_what_its_steps_do_not_by_its_label() -> None:
    offline = example("ops_task", OpsTask)  # drain + offline steps
    budget = ("offline", "remove_node")
    assert safety_kind(offline, budget) == "offline"
    # Labelled load_balance, yet it drains a node: held and counted as an offline task.
    mislabelled = offline.model_copy(update={"need_kind": "load_balance"})
    assert safety_kind(mislabelled, budget) == "offline"
    moves_jobs = mislabelled.model_copy(update={"steps": [
        Step(index=0, name="move", action=MigrateJobs(pool="default", node_id="node-002"))]})
    assert safety_kind(moves_jobs, budget) == "load_balance"
    # A scale-in's nodes are counted by its children (remove_node), not by the parent.
    removes = moves_jobs.model_copy(update={"need_kind": "scale_in", "steps": [
        Step(index=0, name="remove", action=RemoveCapacity(pool="default"))]})
    assert safety_kind(removes, budget) == "scale_in"

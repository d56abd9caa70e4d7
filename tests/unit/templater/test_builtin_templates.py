"""The built-in templates: they load, plan valid tasks with the method's step orders, and
plan deterministically."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import get_args
from uuid import UUID

import pytest

from schemas.events.v1 import CENTRE_ACTIONS, NeedKind, OpsNeed, OpsTask
from services.templater.templates import load_templates, plan
from tests.contracts.examples import example

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
POOL_NEEDS = {"scale_out", "scale_in"}


def need(kind: NeedKind, target: str = "node-002", **update: object) -> OpsNeed:
    base = example("ops_need", OpsNeed)
    # Pool needs name the pool as their target, as the analyzer raises them.
    target = base.pool if kind in POOL_NEEDS else target
    return base.model_copy(update={"kind": kind, "target": target, **update})


def test_the_registry_serves_every_need_kind() -> None:
    assert set(load_templates()) == set(get_args(NeedKind))


@pytest.mark.parametrize("kind", get_args(NeedKind))
def test_every_builtin_template_plans_a_valid_task(kind: NeedKind) -> None:
    template = load_templates()[kind]
    task = plan(template, need(kind), NOW, "templater")
    # Built as a model; prove it survives the wire, field for field.
    assert OpsTask.model_validate_json(task.model_dump_json()) == task
    assert task.need_kind == kind
    assert task.kind == kind
    assert task.action_type is None
    assert task.parent_task_id is None
    assert task.template == template.label
    assert task.evidence == need(kind).evidence
    assert not task.dry_run


# (action, guard, the action's node_id or None) per step, in order.
STEPS: dict[str, list[tuple[str, str | None, str | None]]] = {
    "offline": [
        ("drain_node", None, "node-002"),
        ("offline_node", None, "node-002"),
        ("add_capacity", "pool_above_range", None),
        ("migrate_jobs", "node_has_jobs", "node-002"),
        ("add_capacity", "pool_above_range", None),
    ],
    "online": [
        ("online_node", None, "node-002"),
        ("remove_capacity", "pool_below_range", None),
        ("migrate_jobs", "nodes_out_of_range", None),
        ("remove_capacity", "pool_below_range", None),
    ],
    "scale_out": [
        ("add_capacity", None, None),
        ("migrate_jobs", "nodes_out_of_range", None),
    ],
    "scale_in": [
        ("remove_capacity", None, None),
        ("migrate_jobs", "nodes_out_of_range", None),
    ],
    "load_balance": [
        ("migrate_jobs", None, "node-002"),
        ("add_capacity", "nodes_out_of_range", None),
    ],
    "restart_agent": [
        ("restart_agent", None, "node-002"),
    ],
}
PRIORITY = {"offline": 1, "restart_agent": 2, "online": 3, "scale_out": 4, "load_balance": 5,
            "scale_in": 6}


@pytest.mark.parametrize("kind", get_args(NeedKind))
def test_step_order_guards_and_priority_follow_the_method(kind: NeedKind) -> None:
    task = plan(load_templates()[kind], need(kind), NOW, "templater")
    assert [
        (s.action.action, s.guard, getattr(s.action, "node_id", None)) for s in task.steps
    ] == STEPS[kind]
    assert task.priority == PRIORITY[kind]
    # Every centre action on a pool works on the need's pool.
    for step in task.steps:
        if step.action.action in CENTRE_ACTIONS and hasattr(step.action, "pool"):
            assert getattr(step.action, "pool", None) == "default"


def test_load_balance_moves_one_job_from_its_node() -> None:
    task = plan(load_templates()["load_balance"], need("load_balance"), NOW, "templater")
    migrate = task.steps[0].action
    assert migrate.action == "migrate_jobs"
    assert (migrate.pool, migrate.node_id, migrate.max_jobs) == ("default", "node-002", 1)


def test_capacity_steps_compute_their_count_when_they_run() -> None:
    for kind in get_args(NeedKind):
        task = plan(load_templates()[kind], need(kind), NOW, "templater")
        for step in task.steps:
            if step.action.action in ("add_capacity", "remove_capacity"):
                assert getattr(step.action, "nodes", None) == 0, (kind, step.name)


@pytest.mark.parametrize(
    ("kind", "own_keys"),
    [
        ("offline", ["node.local.node-002"]),
        ("online", ["node.local.node-002"]),
        ("load_balance", ["node.local.node-002"]),
        ("scale_out", ["pool.local.default"]),
        ("scale_in", ["pool.local.default"]),
    ],
)
def test_mutex_keys(kind: NeedKind, own_keys: list[str]) -> None:
    task = plan(load_templates()[kind], need(kind), NOW, "templater")
    # Only its own locks: the template's concurrency is a semaphore, not a slot key.
    assert task.mutex_keys == own_keys


@pytest.mark.parametrize(
    ("kind", "count", "concurrency"),
    [("offline", 1, 16), ("online", 1, 16), ("load_balance", 1, 8),
     ("scale_out", None, 4), ("scale_in", None, 4), ("restart_agent", 1, 16)],
)
def test_execution_count_and_concurrency(kind: NeedKind, count: int | None,
                                         concurrency: int) -> None:
    # Offline: one node per task; load_balance: one job moved; scaling: nodes computed at
    # run time (None, shown as such).
    task = plan(load_templates()[kind], need(kind), NOW, "templater")
    assert task.execution_count == count
    assert task.relations is not None
    assert task.relations.concurrency == concurrency


def test_the_builtin_templates_keep_running_alongside_each_other() -> None:
    # The default exclusion on a pool is lifted between every pair the templates list, and
    # scale_out and scale_in of a pool stay apart (their pool lock keeps them apart too).
    registry = load_templates()
    concurrent = {t.name: set(t.task_relations.concurrent_with) for t in registry.values()}
    assert concurrent["offline"] == {"online", "load_balance", "scale_out", "scale_in",
                                     "restart_agent"}
    assert concurrent["restart_agent"] == {"offline", "online", "load_balance", "scale_out",
                                           "scale_in"}
    assert "scale_in" not in concurrent["scale_out"]
    assert all(t.task_relations.exclusive_with == [] for t in registry.values())


def test_scale_out_and_scale_in_of_one_pool_share_the_pool_lock() -> None:
    out = plan(load_templates()["scale_out"], need("scale_out"), NOW, "templater")
    into = plan(load_templates()["scale_in"], need("scale_in"), NOW, "templater")
    assert set(out.mutex_keys) & set(into.mutex_keys) == {"pool.local.default"}


def test_offline_and_online_of_one_node_share_the_node_lock() -> None:
    off = plan(load_templates()["offline"], need("offline"), NOW, "templater")
    on = plan(load_templates()["online"], need("online"), NOW, "templater")
    assert set(off.mutex_keys) & set(on.mutex_keys) == {"node.local.node-002"}


@pytest.mark.parametrize("kind", get_args(NeedKind))
def test_plans_are_deterministic(kind: NeedKind) -> None:
    first = plan(load_templates()[kind], need(kind), NOW, "templater")
    # Loaded again (another process, a restart) and planned again: the same task.
    again = plan(load_templates()[kind], need(kind), NOW, "templater")
    assert again == first
    # A redelivery later: the same task id, steps and locks.
    later = plan(load_templates()[kind], need(kind), NOW + timedelta(seconds=5), "templater")
    assert (later.task_id, later.event_id) == (first.task_id, first.event_id)
    assert (later.steps, later.mutex_keys) == (first.steps, first.mutex_keys)
    # Another need: another task.
    other = need(kind, event_id=UUID(int=99, version=4))
    assert plan(load_templates()[kind], other, NOW, "templater").task_id != first.task_id


def test_a_dry_run_need_or_templater_makes_a_dry_run_task() -> None:
    template = load_templates()["offline"]
    assert plan(template, need("offline", dry_run=True), NOW, "templater").dry_run
    assert plan(template, need("offline"), NOW, "templater", dry_run=True).dry_run


def test_a_templates_breaker_scope_goes_onto_its_tasks() -> None:
    template = load_templates()["offline"]
    assert plan(template, need("offline"), NOW, "templater").breaker_scope is None
    scoped = template.model_copy(update={"breaker_scope": "node"})
    assert plan(scoped, need("offline"), NOW, "templater").breaker_scope == "node"

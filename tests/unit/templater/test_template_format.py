"""The template format: placeholders and parameters, load errors that name the file and the
field, the registry, execution counts, and the relations tasks carry."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.events.v1 import Dependency, ExclusiveWith, NeedKind, OpsNeed, OpsTask
from services.templater.templates import (
    PlanError,
    Template,
    TemplateError,
    load_template,
    load_templates,
    plan,
)
from tests.contracts.examples import example

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def template(**update: Any) -> dict[str, Any]:
    """A valid template as YAML data; `update` replaces top-level fields (None deletes)."""
    data: dict[str, Any] = {
        "name": "drain_only",
        "version": 1,
        "need": "offline",
        "description": "Drain a node.",
        "priority": 2,
        "mutex": ["node.{cluster}.{target}"],
        "steps": [{"name": "drain", "action": "drain_node", "args": {"node_id": "{target}"}}],
    }
    data.update(update)
    return {k: v for k, v in data.items() if v is not None}


def step(**fields: Any) -> dict[str, Any]:
    return {"name": "s", "action": "drain_node", "args": {"node_id": "{target}"}, **fields}


def write(directory: Path, filename: str, data: dict[str, Any]) -> Path:
    path = directory / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def need(kind: NeedKind = "offline", target: str = "node-002") -> OpsNeed:
    return example("ops_need", OpsNeed).model_copy(update={"kind": kind, "target": target})


def load_error(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(TemplateError) as err:
        load_template(write(tmp_path, "broken.yaml", data))
    assert str(err.value).startswith("broken.yaml: ")
    return str(err.value)


# ---------------------------------------------------------------- load errors


@pytest.mark.parametrize(
    ("data", "field", "why"),
    [
        (template(steps=[step(action="exec_shell")]),
         "steps.0.action", "unknown action 'exec_shell'"),
        (template(steps=[step(action="query_status")]), "steps.0.action", "executor itself"),
        (template(steps=[step(args={"node_id": "{target}", "nodez": 1})]),
         "steps.0.args.nodez", "Extra inputs are not permitted"),
        (template(steps=[step(action="migrate_jobs", args={"pool": "{pool}", "max_jobs": 0})]),
         "steps.0.args.max_jobs", "greater than or equal to 1"),
        (template(steps=[step(action="add_capacity", args={"pool": "{pool}", "nodes": "two"})]),
         "steps.0.args.nodes", "valid integer"),
        (template(steps=[step(args={})]), "steps.0.args.node_id", "Field required"),
        (template(steps=[step(args={"node_id": "{node}"})]),
         "steps.0.args.node_id", "unknown placeholder {node}"),
        (template(steps=[step(args={"node_id": "{target.upper}"})]),
         "steps.0.args.node_id", "only plain placeholders"),
        (template(steps=[step(args={"node_id": "{target"})]),
         "steps.0.args.node_id", "not a valid template string"),
        (template(steps=[step(args={"node_id": "{target}", "action": "offline_node"})]),
         "steps.0.args.action", "set by the step's `action`"),
        (template(steps=[step(guard="pool_hot")]), "steps.0.guard", "Input should be"),
        (template(steps=[step(action="add_capacity", args={"pool": "{pool}"},
                              guard="node_has_jobs")]),
         "steps.0.guard", "node_has_jobs needs a step that names its node"),
        (template(steps=[step(name="a"), step(name="a")]), "steps.1.name", "repeats steps.0"),
        (template(steps=[step(timeout_s=0)]), "steps.0.timeout_s", "greater than 0"),
        (template(steps=[]), "steps", "at least 1 item"),
        (template(steps=None), "steps", "Field required"),
        (template(need="teleport"), "need", "Input should be"),
        (template(mutex=["node/{cluster}/{target}"]), "mutex.0", "does not make a lock key"),
        (template(mutex=["node.{target}"]), "mutex.0", "does not name {cluster}"),
        (template(mutex=["node.{node}"]), "mutex.0", "unknown placeholder {node}"),
        (template(name="drain.only"), "name", "should match pattern"),
        (template(concurrency=0), "concurrency", "greater than or equal to 1"),
        (template(execution_count=-1), "execution_count", "greater than or equal to 0"),
        (template(steps=[step(execution_count="two")]), "steps.0.execution_count",
         "valid integer"),
        (template(relations={"exclusive_with": [{"template": "online", "scope": "rack"}]}),
         "relations.exclusive_with.0.scope", "Input should be"),
        (template(depends_on=[{"template": "online", "on_failure": "retry"}]),
         "depends_on.0.on_failure", "Input should be"),
        (template(parameters={"target": "x"}), "parameters.target", "reserved"),
        (template(parameters={"unused": 1}), "parameters.unused", "not used by any step"),
        (template(retry={"max_attempts": 3, "backoff_s": 2}), "retry.backoff_s",
         "Extra inputs are not permitted"),
        (template(relations={"exclusive_with": ["drain_only"]}),
         "relations.exclusive_with.0", "cannot relate to itself"),
        (template(relations={"concurrent_with": ["online"], "exclusive_with": ["online"]}),
         "relations.concurrent_with.0", "also in relations.exclusive_with"),
        (template(depends_on=["offline"]), "depends_on.0", "cannot relate to itself"),
        (template(relations={"parallel": ["online"]}), "relations.parallel", "Extra inputs"),
    ],
)
def test_a_bad_template_names_file_and_field(
    tmp_path: Path, data: dict[str, Any], field: str, why: str
) -> None:
    message = load_error(tmp_path, data)
    assert f"{field}: " in message
    assert why in message


def test_every_fault_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    message = load_error(tmp_path, template(
        steps=[step(args={"node_id": "{node}"}), step(name="s", guard="node_has_jobs")],
        parameters={"pool": "p"},
    ))
    for field in ("steps.0.args.node_id", "steps.1.name", "parameters.pool"):
        assert field in message


def test_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("")
    with pytest.raises(TemplateError, match=r"^broken.yaml: empty"):
        load_template(path)
    path.write_text("name: [unclosed\n")
    with pytest.raises(TemplateError, match=r"^broken.yaml: not valid YAML"):
        load_template(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(TemplateError, match=r"^broken.yaml: .*valid dictionary"):
        load_template(path)


# ---------------------------------------------------------------- parameters and placeholders


def test_parameters_keep_their_type_and_fill_text(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(
        parameters={"jobs": 3, "checkpoint_s": 45.5, "suffix": "standby"},
        steps=[
            step(name="move", action="migrate_jobs",
                 args={"pool": "{pool}", "node_id": "{target}", "max_jobs": "{jobs}"}),
            step(name="move-one", action="migrate_job",
                 args={"node_id": "{target}", "job_id": "train-{target}",
                       "to_node_id": "{pool}-{suffix}", "checkpoint_timeout_s": "{checkpoint_s}"}),
            step(name="literal", action="add_capacity", args={"pool": "gpu-a100", "nodes": 2},
                 guard="pool_above_range", timeout_s=120, max_attempts=1),
        ],
    )))
    task = plan(loaded, need(), NOW, "templater")
    move, move_one, literal = (s.action for s in task.steps)
    assert move.action == "migrate_jobs"
    assert (move.pool, move.node_id, move.max_jobs) == ("default", "node-002", 3)
    assert move_one.action == "migrate_job"
    assert (move_one.job_id, move_one.to_node_id) == ("train-node-002", "default-standby")
    assert move_one.checkpoint_timeout_s == 45.5
    assert literal.action == "add_capacity"
    assert (literal.pool, literal.nodes) == ("gpu-a100", 2)
    assert (task.steps[2].guard, task.steps[2].timeout_s) == ("pool_above_range", 120.0)


def test_retry_max_attempts_is_the_default_of_every_step(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(
        retry={"max_attempts": 5}, steps=[step(name="a"), step(name="b", max_attempts=1)],
    )))
    task = plan(loaded, need(), NOW, "templater")
    assert [s.max_attempts for s in task.steps] == [5, 1]


def test_escaped_braces_are_literal(tmp_path: Path) -> None:
    # Not a useful node id, but proves `{{` is not read as a placeholder.
    data = template(steps=[step(args={"node_id": "{{target}}"})])
    message = load_error(tmp_path, data)
    assert "steps.0.args.node_id: String should match pattern" in message


def test_a_need_whose_values_do_not_fit_fails_to_plan(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(
        steps=[step(args={"node_id": "{target}-with-a-rather-long-suffix"})],
    )))
    with pytest.raises(PlanError, match="step s"):
        plan(loaded, need(target="n" * 120), NOW, "templater")
    with pytest.raises(PlanError, match="serves offline, not online"):
        plan(loaded, need(kind="online"), NOW, "templater")


# ---------------------------------------------------------------- the registry


def test_two_templates_for_one_need_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a"))
    write(tmp_path, "b.yaml", template(name="b"))
    with pytest.raises(TemplateError, match=r"^b.yaml: need: a second template for need "
                                            r"'offline' \(the first is a.yaml\)"):
        load_templates(tmp_path)


def test_two_templates_with_one_name_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="same"))
    write(tmp_path, "b.yaml", template(name="same", need="online"))
    with pytest.raises(TemplateError, match=r"^b.yaml: name: a second template named"):
        load_templates(tmp_path)


def test_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"no \*\.yaml templates"):
        load_templates(tmp_path)


def test_a_broken_file_stops_the_registry(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a"))
    write(tmp_path, "b.yaml", template(name="b", need="online", priority=12))
    with pytest.raises(TemplateError, match=r"^b.yaml: priority: "):
        load_templates(tmp_path)


def test_a_relation_to_a_missing_template_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", depends_on=["scale_in"]))
    with pytest.raises(TemplateError, match=r"^a.yaml: depends_on.0: no template or need kind "
                                            r"named 'scale_in'"):
        load_templates(tmp_path)


def test_concurrent_with_an_excluded_template_is_an_error(tmp_path: Path) -> None:
    # The contradiction spans two files: b says concurrent, a says exclusive.
    write(tmp_path, "a.yaml", template(name="a", relations={"exclusive_with": ["b"]}))
    write(tmp_path, "b.yaml", template(name="b", need="online",
                                       relations={"concurrent_with": ["a"]}))
    with pytest.raises(TemplateError, match=r"^b.yaml: relations.concurrent_with.0: a is "
                                            r"excluded from b .*in a.yaml"):
        load_templates(tmp_path)


def test_relations_need_the_registry(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "a.yaml", template(depends_on=["online"])))
    with pytest.raises(TemplateError, match="resolved by load_templates"):
        plan(loaded, need(), NOW, "templater")


# ---------------------------------------------------------------- locks and relations


def planned(template: Template, target: str = "node-002",
            kind: NeedKind = "offline") -> OpsTask:
    return plan(template, need(kind, target), NOW, "templater")


def test_a_task_holds_its_own_locks_only(tmp_path: Path) -> None:
    # Concurrency and relations are no lock keys any more: two targets of one template share
    # no key, so nothing but the template's semaphore bounds how many run.
    loaded = load_template(write(tmp_path, "t.yaml", template(concurrency=4)))
    assert planned(loaded).mutex_keys == ["node.local.node-002"]
    assert not set(planned(loaded, "node-001").mutex_keys) & set(planned(loaded).mutex_keys)
    relations = planned(loaded).relations
    assert relations is not None
    assert relations.concurrency == 4


def test_an_exclusion_declared_on_one_side_holds_on_both(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", mutex=["a.{cluster}.{target}"],
                                       relations={"exclusive_with": [
                                           {"template": "online", "scope": "pool"}]}))
    write(tmp_path, "b.yaml", template(name="b", need="online", mutex=["b.{cluster}.{target}"]))
    registry = load_templates(tmp_path)
    assert registry["offline"].task_relations.exclusive_with == [
        ExclusiveWith(template="b", scope="pool")]
    assert registry["online"].task_relations.exclusive_with == [
        ExclusiveWith(template="a", scope="pool")]


def test_a_bare_name_is_a_cluster_wide_relation(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", relations={"exclusive_with": ["b"]},
                                       depends_on=["online"]))
    write(tmp_path, "b.yaml", template(name="b", need="online"))
    relations = load_templates(tmp_path)["offline"].task_relations
    assert relations.exclusive_with == [ExclusiveWith(template="b", scope="cluster")]
    assert relations.depends_on == [Dependency(template="b", scope="cluster",
                                               on_failure="fail")]


def test_depends_on_is_an_order_not_an_exclusion(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", depends_on=[
        {"template": "b", "scope": "target", "on_failure": "proceed"}]))
    write(tmp_path, "b.yaml", template(name="b", need="online"))
    registry = load_templates(tmp_path)
    assert registry["offline"].task_relations.depends_on == [
        Dependency(template="b", scope="target", on_failure="proceed")]
    # The other side is not held back by it: it carries no relation to a.
    assert registry["online"].task_relations.exclusive_with == []
    assert registry["online"].task_relations.depends_on == []


def test_concurrent_with_is_symmetric(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", relations={"concurrent_with": ["online"]}))
    write(tmp_path, "b.yaml", template(name="b", need="online"))
    registry = load_templates(tmp_path)
    assert registry["offline"].task_relations.concurrent_with == ["b"]
    assert registry["online"].task_relations.concurrent_with == ["a"]


def test_a_relation_may_name_a_need_kind(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a"))
    write(tmp_path, "b.yaml", template(name="b", need="online",
                                       relations={"exclusive_with": ["offline"]}))
    registry = load_templates(tmp_path)
    assert registry["offline"].task_relations.exclusive_with == [
        ExclusiveWith(template="b", scope="cluster")]


# ---------------------------------------------------------------- execution counts


def test_a_declared_execution_count_is_the_tasks(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(execution_count=1, steps=[
        step(name="drain"),
        step(name="move", action="migrate_jobs", args={"pool": "{pool}", "max_jobs": 3})])))
    task = planned(loaded)
    assert task.execution_count == 1
    assert [s.execution_count for s in task.steps] == [1, 3]


def test_an_undeclared_count_sums_the_steps_or_waits_for_run_time(tmp_path: Path) -> None:
    counted = load_template(write(tmp_path, "a.yaml", template(steps=[
        step(name="add", action="add_capacity", args={"pool": "{pool}", "nodes": 2}),
        step(name="move", action="migrate_jobs", args={"pool": "{pool}", "max_jobs": 3})])))
    assert planned(counted).execution_count == 5
    at_run_time = load_template(write(tmp_path, "b.yaml", template(steps=[
        step(name="add", action="add_capacity", args={"pool": "{pool}", "nodes": 0}),
        step(name="drain")])))
    task = planned(at_run_time)
    assert task.execution_count is None
    assert [s.execution_count for s in task.steps] == [None, 1]


def test_a_steps_declared_count_wins_over_its_action(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "a.yaml", template(steps=[
        step(name="add", action="add_capacity", args={"pool": "{pool}"},
             execution_count=2)])))
    assert planned(loaded).steps[0].execution_count == 2


# ---------------------------------------------------------------- node steps' settings


def test_offline_names_its_taint_effect_and_online_its_health_check(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(
        parameters={"hold": 60},
        steps=[step(name="offline", action="offline_node",
                    args={"node_id": "{target}", "effect": "NoExecute"}),
               step(name="online", action="online_node",
                    args={"node_id": "{target}",
                          "health_check": {"conditions_clear": True, "hold_s": "{hold}"}})],
    )))
    offline, online = (s.action for s in plan(loaded, need(), NOW, "templater").steps)
    assert offline.action == "offline_node"
    assert offline.effect == "NoExecute"
    assert online.action == "online_node"
    assert online.health_check is not None
    assert (online.health_check.conditions_clear, online.health_check.hold_s) == (True, 60.0)
    # Unnamed: NoSchedule, and online at once.
    plain = load_template(write(tmp_path, "p.yaml", template(steps=[
        step(name="offline", action="offline_node", args={"node_id": "{target}"}),
        step(name="online", action="online_node", args={"node_id": "{target}"})])))
    offline, online = (s.action for s in plan(plain, need(), NOW, "templater").steps)
    assert offline.action == "offline_node"
    assert offline.effect == "NoSchedule"
    assert online.action == "online_node"
    assert online.health_check is None


@pytest.mark.parametrize(("args", "field", "why"), [
    ({"node_id": "{target}", "effect": "PreferNoSchedule"}, "steps.0.args.effect",
     "Input should be 'NoSchedule' or 'NoExecute'"),
    ({"node_id": "{target}", "health_check": {"hold_s": -5}},
     "steps.0.args.health_check.hold_s", "greater than or equal to 0"),
    ({"node_id": "{target}", "health_check": {"hold": 60}}, "steps.0.args.health_check.hold",
     "Extra inputs"),
    ({"node_id": "{target}", "health_check": {"hold_s": "{nope}"}},
     "steps.0.args.health_check.hold_s", "unknown placeholder {nope}"),
])
def test_a_bad_effect_or_health_check_names_its_field(
    tmp_path: Path, args: dict[str, Any], field: str, why: str,
) -> None:
    action = "offline_node" if "effect" in args else "online_node"
    message = load_error(tmp_path, template(steps=[step(action=action, args=args)]))
    assert f"{field}: " in message
    assert why in message

"""The template format: placeholders and parameters, load errors that name the file and the
field, the registry, and the lock keys of execution counts and relations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.events.v1 import NeedKind, OpsNeed
from services.shared.locks import slot_of
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
        (template(execution_count=17), "execution_count", "less than or equal to 16"),
        (template(parameters={"target": "x"}), "parameters.target", "reserved"),
        (template(parameters={"unused": 1}), "parameters.unused", "not used by any step"),
        (template(retry={"max_attempts": 3, "backoff_s": 2}), "retry.backoff_s",
         "Extra inputs are not permitted"),
        (template(relations={"exclusive_with": ["drain_only"]}),
         "relations.exclusive_with.0", "cannot relate to itself"),
        (template(relations={"concurrent_with": ["online"], "exclusive_with": ["online"]}),
         "relations.concurrent_with.0", "also in relations.exclusive_with or depends_on"),
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


def test_too_many_lock_keys_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a", execution_count=16))
    write(tmp_path, "b.yaml", template(name="b", need="online", depends_on=["a"]))
    with pytest.raises(TemplateError, match=r"^b.yaml: execution_count/relations: a task "
                                            r"would hold 18 locks"):
        load_templates(tmp_path)


def test_relations_need_the_registry(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "a.yaml", template(depends_on=["online"])))
    with pytest.raises(TemplateError, match="resolved by load_templates"):
        plan(loaded, need(), NOW, "templater")


# ---------------------------------------------------------------- locks


def keys_of(template: Template, target: str, kind: NeedKind = "offline") -> set[str]:
    return set(plan(template, need(kind, target), NOW, "templater").mutex_keys)


def test_execution_count_one_is_one_key_per_cluster(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template()))
    assert plan(loaded, need(), NOW, "templater").mutex_keys == [
        "node.local.node-002", "tpl.drain_only.local",
    ]
    # Two nodes, one slot: they wait for each other.
    assert keys_of(loaded, "node-001") & keys_of(loaded, "node-002") == {"tpl.drain_only.local"}


def test_execution_count_n_spreads_targets_over_n_slots(tmp_path: Path) -> None:
    loaded = load_template(write(tmp_path, "t.yaml", template(execution_count=4)))
    slots = {
        next(k for k in keys_of(loaded, f"node-{i:03}") if k.startswith("tpl."))
        for i in range(40)
    }
    assert slots == {f"tpl.drain_only.local.{i}" for i in range(4)}


SLOT_TARGETS = [f"node-{i:03}" for i in range(40)] + ["gpu-a100-x", "ñode-ü", ""]
SLOT_COUNTS = [1, 2, 3, 4, 7, 16]
SLOTS_SCRIPT = (
    "import json, sys\n"
    "from services.shared.locks import slot_of\n"
    "targets, counts = json.loads(sys.argv[1])\n"
    "print(json.dumps([[slot_of(t, n) for n in counts] for t in targets]))\n"
)


def slots_in_a_new_process(hash_seed: str) -> list[list[int]]:
    """slot_of of every SLOT_TARGETS x SLOT_COUNTS, computed by a fresh interpreter whose
    str hash is salted with `hash_seed`."""
    done = subprocess.run(
        [sys.executable, "-c", SLOTS_SCRIPT, json.dumps([SLOT_TARGETS, SLOT_COUNTS])],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    slots: list[list[int]] = json.loads(done.stdout)
    return slots


def test_a_targets_slot_is_the_same_in_every_process() -> None:
    # Each process (scheduler, templater replicas) computes the slot on its own, and Python
    # salts its str hash per process: two interpreters with different salts must agree.
    first, second = slots_in_a_new_process("1"), slots_in_a_new_process("2")
    here = [[slot_of(t, n) for n in SLOT_COUNTS] for t in SLOT_TARGETS]
    assert first == second, "slot_of differs between processes with different hash seeds"
    assert first == here, "slot_of differs between a new process and this one"
    assert all(0 <= slot < n for row in here for slot, n in zip(row, SLOT_COUNTS, strict=True))


@pytest.mark.parametrize(("a_slots", "b_slots"), [(1, 1), (1, 3), (4, 1), (3, 5)])
def test_an_exclusion_holds_back_the_other_template_only(
    tmp_path: Path, a_slots: int, b_slots: int
) -> None:
    # Declared on one side only (depends_on): the lock is shared by both.
    write(tmp_path, "a.yaml", template(name="a", execution_count=a_slots,
                                       mutex=["a.{cluster}.{target}"]))
    write(tmp_path, "b.yaml", template(name="b", need="online", execution_count=b_slots,
                                       mutex=["b.{cluster}.{target}"], depends_on=["offline"]))
    registry = load_templates(tmp_path)
    targets = [f"node-{i:03}" for i in range(12)]
    a_keys = {t: keys_of(registry["offline"], t) for t in targets}
    b_keys = {t: keys_of(registry["online"], t, "online") for t in targets}
    for ta, tb in product(targets, targets):
        assert any(k.startswith("excl.a.b.local") for k in a_keys[ta] & b_keys[tb])
    # Two tasks of one template in different slots share no key at all.
    for keys, slots in ((a_keys, a_slots), (b_keys, b_slots)):
        for t1, t2 in product(targets, targets):
            if t1 != t2 and slot_of(t1, slots) != slot_of(t2, slots):
                assert not keys[t1] & keys[t2]


def test_a_one_slot_exclusion_is_one_shared_key(tmp_path: Path) -> None:
    write(tmp_path, "x.yaml", template(name="zeta", relations={"exclusive_with": ["alpha"]}))
    write(tmp_path, "y.yaml", template(name="alpha", need="online",
                                       relations={"exclusive_with": ["zeta"]}))
    registry = load_templates(tmp_path)
    assert plan(registry["offline"], need(), NOW, "templater").mutex_keys == [
        "node.local.node-002", "tpl.zeta.local", "excl.alpha.zeta.local",
    ]
    assert "excl.alpha.zeta.local" in keys_of(registry["online"], "node-009", "online")


def test_a_relation_may_name_a_need_kind(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", template(name="a"))
    write(tmp_path, "b.yaml", template(name="b", need="online",
                                       relations={"exclusive_with": ["offline"]}))
    registry = load_templates(tmp_path)
    assert "excl.a.b.local" in keys_of(registry["offline"], "node-001")

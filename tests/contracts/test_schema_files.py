"""The published JSON Schemas (docs/schemas/) are what the models make, and a change to one
stays within what v1 allows.

Run before regenerating: when a model changed, the failure says whether the change is an
allowed one (new optional fields, with the topic's minor raised) or a v2 (docs/events.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.export import documents, render

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "docs" / "schemas"
REGENERATE = "python -m schemas.export docs/schemas"
MADE = documents()


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target: dict[str, Any] = root["$defs"][ref.removeprefix("#/$defs/")]
        return target
    return node


def field_paths(schema: dict[str, Any]) -> tuple[dict[str, bool], set[str]]:
    """Every field of a schema by path (`steps[].action.node_id`), with whether it is
    required; and the paths of the objects holding fields ("" is the message itself).
    Paths follow the data, not the names of nested models, so renaming a model changes
    nothing here; the members of a union share their paths."""
    fields: dict[str, bool] = {}
    objects: set[str] = set()

    def walk(node: dict[str, Any], path: str, depth: int) -> None:
        node = resolve(node, schema)
        if depth > 32:  # the contract has no recursive models; this only bounds a mistake
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for member in node.get(key, ()):
                walk(member, path, depth + 1)
        if "properties" in node:
            objects.add(path)
            required = set(node.get("required", ()))
            for name, child in node["properties"].items():
                child_path = f"{path}.{name}" if path else name
                fields[child_path] = fields.get(child_path, False) or name in required
                walk(child, child_path, depth + 1)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]", depth + 1)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}", depth + 1)

    walk(schema, "", 0)
    return fields, objects


def parent(path: str) -> str:
    return path.rpartition(".")[0] if "." in path else ""


def what_changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why a change of `old` into `new` is not an allowed change within v1 (empty: it is)."""
    old_fields, old_objects = field_paths(old)
    new_fields, _ = field_paths(new)
    problems = []
    removed = sorted(old_fields.keys() - new_fields.keys())
    if removed:
        problems.append(f"fields removed or renamed ({', '.join(removed)}): that is a v2")
    newly_required = sorted(
        path for path, required in new_fields.items()
        if required and not old_fields.get(path, False)
        and (path in old_fields or parent(path) in old_objects))
    if newly_required:
        problems.append(f"fields now required ({', '.join(newly_required)}): a message of an "
                        "older producer would be refused, that is a v2; make them optional "
                        "with a default that keeps today's meaning")
    added = sorted(new_fields.keys() - old_fields.keys())
    if added and new["x-schema-minor"] <= old["x-schema-minor"]:
        problems.append(f"fields added ({', '.join(added)}) without raising the minor: "
                        f"declare `schema_minor: SchemaMinor = written_at_minor("
                        f"{old['x-schema-minor'] + 1})` on the model")
    return problems


@pytest.mark.parametrize("name", sorted(MADE))
def test_the_committed_schema_is_what_the_model_makes(name: str) -> None:
    path = SCHEMA_DIR / f"{name}.json"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: {REGENERATE}"
    committed = path.read_text()
    problems = what_changed(json.loads(committed), MADE[name])
    assert problems == [], f"{name}: not an allowed change within v1 (docs/events.md)"
    assert committed == render(MADE[name]), f"{path.relative_to(ROOT)} is stale: {REGENERATE}"


def test_no_committed_schema_is_left_without_a_topic() -> None:
    assert {p.stem for p in SCHEMA_DIR.glob("*.json")} == set(MADE), REGENERATE


def test_every_schema_says_its_version_and_that_newer_minors_may_add_fields() -> None:
    for name, document in MADE.items():
        assert document["$id"] == f"{name}.json"
        assert document["x-schema-version"] == 1
        assert type(document["x-schema-minor"]) is int
        assert "schema_minor" in document["properties"]
        assert document["additionalProperties"] is False


def base_schema() -> dict[str, Any]:
    return json.loads(render(MADE["ops.tasks.v1"]))  # type: ignore[no-any-return]


def test_a_new_optional_field_with_the_minor_raised_is_allowed() -> None:
    old, new = base_schema(), base_schema()
    new["properties"]["owner"] = {"type": "string", "default": ""}
    assert what_changed(old, new) == ["fields added (owner) without raising the minor: "
                                      "declare `schema_minor: SchemaMinor = "
                                      "written_at_minor(1)` on the model"]
    new["x-schema-minor"] = 1
    assert what_changed(old, new) == []
    # A new optional object may have required fields of its own.
    new["properties"]["lease"] = {"type": "object", "required": ["until"],
                                  "properties": {"until": {"type": "string"}}}
    assert what_changed(old, new) == []


def test_a_removed_or_newly_required_field_is_a_v2() -> None:
    old, new = base_schema(), base_schema()
    del new["properties"]["dry_run"]
    new["required"].append("parent_task_id")
    new["$defs"]["Step"]["required"].append("guard")
    problems = what_changed(old, new)
    assert len(problems) == 2
    assert "dry_run" in problems[0]
    assert "parent_task_id, steps[].guard" in problems[1]

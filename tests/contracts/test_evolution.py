"""Additive evolution within v1: a reader takes a newer producer's message, and nothing else.

A message whose `schema_minor` is above the reader's may carry fields the reader does not
know; they are ignored at every depth, and every known field is still checked strictly. The
same unknown field at the reader's own minor (or none) is refused as before (docs/events.md).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, Field, ValidationError, create_model

from common.errors import PermanentError, describe_validation_error
from common.messaging import parse_event
from common.signing import CommandVerifier, KeyRegistry, TrustedKey, b64url
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import SchemaMinor, Versioned, written_at_minor
from schemas.events.v1 import (
    EVENT_MODELS,
    Command,
    CommandPayload,
    GpuMetrics,
    HealthCheck,
    NodeReport,
    OnlineNode,
    OpsTask,
    TaskScheduled,
)
from tests.contracts.examples import GOLDEN, examples

NEWER = NodeReport.SCHEMA_MINOR + 1


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())
    return data


def newer_report(minor: int = NEWER) -> dict[str, Any]:
    """A node report as a producer one minor ahead writes it: a new top-level field, and one
    in an item of a list of nested models."""
    data = golden("node_report") | {"schema_minor": minor, "rack": "r-12"}
    data["gpus"][0]["fan_pct"] = 41.5
    return data


def refusal_types(model: type[Versioned], data: dict[str, Any]) -> set[str]:
    with pytest.raises(ValidationError) as err:
        model.model_validate_json(json.dumps(data))
    return {str(e["type"]) for e in err.value.errors()}


def test_an_old_reader_takes_a_newer_producers_message_with_known_fields_intact() -> None:
    report = NodeReport.model_validate_json(json.dumps(newer_report()))
    today = NodeReport.model_validate_json(json.dumps(golden("node_report")))
    assert report.schema_minor == NEWER
    assert report.model_dump(exclude={"schema_minor"}) == today.model_dump()
    assert report.gpus[0] == today.gpus[0]


def test_the_same_unknown_field_at_the_readers_own_minor_is_refused() -> None:
    for minor in (NodeReport.SCHEMA_MINOR, None):
        data = newer_report()
        if minor is None:
            del data["schema_minor"]
        else:
            data["schema_minor"] = minor
        with pytest.raises(ValidationError) as err:
            NodeReport.model_validate_json(json.dumps(data))
        assert describe_validation_error(err.value).reason == "extra_forbidden"
        assert {e["loc"] for e in err.value.errors()} == {("rack",), ("gpus", 0, "fan_pct")}


@pytest.mark.parametrize(("field", "value", "error"), [
    ("interval_s", "10", "float_type"),  # a known field keeps its strict type
    ("seq", 1.5, "int_type"),
    ("node_id", "node 2; rm", "string_pattern_mismatch"),
])
def test_a_newer_minor_never_loosens_a_known_field(field: str, value: object,
                                                    error: str) -> None:
    assert error in refusal_types(NodeReport, newer_report() | {field: value})


def test_a_newer_minor_never_loosens_a_nested_known_field() -> None:
    data = newer_report()
    data["gpus"][0]["utilization_pct"] = "50"
    assert refusal_types(NodeReport, data) == {"float_type"}


@pytest.mark.parametrize("minor", ["2", 2.0, True, -1, None])
def test_only_an_exact_integer_minor_says_newer(minor: object) -> None:
    types = refusal_types(NodeReport, newer_report() | {"schema_minor": minor})
    assert "extra_forbidden" in types


def test_a_minor_out_of_range_is_refused_whatever_it_carries() -> None:
    assert refusal_types(NodeReport, newer_report(65_536)) == {"less_than_equal"}


def test_every_topic_reads_a_newer_minor_and_refuses_the_field_at_its_own() -> None:
    by_model = {model: name for name, model in EVENT_MODELS.items()}
    for model in TOPIC_MODELS.values():
        data = golden(by_model[model]) | {"added_later": [1, {"a": "b"}]}
        newer = data | {"schema_minor": model.SCHEMA_MINOR + 1}
        assert model.model_validate_json(json.dumps(newer)) == model.model_validate_json(
            json.dumps(golden(by_model[model]) | {"schema_minor": model.SCHEMA_MINOR + 1}))
        with pytest.raises(ValidationError) as err:
            model.model_validate_json(json.dumps(data))
        assert describe_validation_error(err.value).reason == "extra_forbidden"


def with_a_field_added_to_every_object(parsed: object, data: Any) -> Any:
    """`data` (the JSON of `parsed`) with an unknown field in every object that is a model,
    at every depth: lists, unions, nested events and all."""
    if isinstance(parsed, BaseModel) and isinstance(data, dict):
        return {**{key: with_a_field_added_to_every_object(getattr(parsed, key), value)
                   for key, value in data.items()}, "added_later": {"x": [1]}}
    if isinstance(parsed, list | tuple) and isinstance(data, list):
        return [with_a_field_added_to_every_object(p, d) for p, d in zip(parsed, data,
                                                                         strict=True)]
    if isinstance(parsed, dict) and isinstance(data, dict):
        return {key: with_a_field_added_to_every_object(parsed[key], value)
                for key, value in data.items()}
    return data


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_unknown_fields_at_every_depth_are_ignored_only_from_a_newer_minor(name: str) -> None:
    model = EVENT_MODELS[name]
    data = golden(name)
    everywhere = with_a_field_added_to_every_object(model.model_validate_json(json.dumps(data)),
                                                    data)
    newer = {"schema_minor": model.SCHEMA_MINOR + 1}
    assert model.model_validate_json(json.dumps(everywhere | newer)) == (
        model.model_validate_json(json.dumps(data | newer)))
    with pytest.raises(ValidationError) as err:
        model.model_validate_json(json.dumps(everywhere))
    assert {e["type"] for e in err.value.errors()} == {"extra_forbidden"}
    assert len(err.value.errors()) == json.dumps(everywhere).count('"added_later"')


def test_a_command_payload_follows_its_own_minor_at_every_depth() -> None:
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    payload = CommandPayload.for_action(
        OnlineNode(node_id="node-002", health_check=HealthCheck(hold_s=30.0)),
        cluster_id="local", command_id=uuid4(), issued_at=at,
        expires_at=at + timedelta(seconds=60), seq=4)
    data = json.loads(payload.model_dump_json())
    everywhere = with_a_field_added_to_every_object(payload, data)
    assert json.dumps(everywhere).count('"added_later"') == 3
    newer = {"schema_minor": CommandPayload.SCHEMA_MINOR + 1}
    assert CommandPayload.model_validate_json(json.dumps(everywhere | newer)) == (
        payload.model_copy(update=newer))
    with pytest.raises(ValidationError) as err:
        CommandPayload.model_validate_json(json.dumps(everywhere))
    assert len(err.value.errors()) == 3


def test_new_fields_inside_a_step_action_and_a_nested_task_are_ignored_too() -> None:
    # The outer message's minor covers everything inside it, nested events included: one
    # producer wrote the whole message with one set of classes.
    data = golden("task_scheduled") | {"schema_minor": NEWER}
    task = data["task"]
    task["steps"][1]["action"]["grace_s"] = 30  # inside a discriminated union
    task["relations"]["exclusive_with"][0]["why"] = "firmware"
    task["owner"] = "team-a"
    event = TaskScheduled.model_validate_json(json.dumps(data))
    assert event.task == examples()["task_scheduled"].task  # type: ignore[attr-defined]
    data["schema_minor"] = TaskScheduled.SCHEMA_MINOR
    assert "extra_forbidden" in refusal_types(TaskScheduled, data)


def test_python_dicts_follow_the_same_rule() -> None:
    data = examples()["ops_task"].model_dump() | {"owner": "team-a"}
    assert OpsTask.model_validate(data | {"schema_minor": NEWER}).task_id
    with pytest.raises(ValidationError) as err:
        OpsTask.model_validate(data)
    assert describe_validation_error(err.value).reason == "extra_forbidden"


def test_the_consumer_path_takes_a_newer_message_and_refuses_a_typo() -> None:
    body = json.dumps(newer_report()).encode()
    assert parse_event(NodeReport, body, b"node-002", limit=65_536).node_id == "node-002"
    typo = json.dumps(golden("node_report") | {"nodeid": "node-002"}).encode()
    with pytest.raises(ValidationError) as err:
        parse_event(NodeReport, typo, b"node-002", limit=65_536)
    assert describe_validation_error(err.value).reason == "extra_forbidden"


# ---------------------------------------------------------------- producers

# A producer one minor ahead, as the next release would declare it.
NewerGpu = create_model("NewerGpu", __base__=GpuMetrics, fan_pct=(float | None, None))
NewerReport = create_model(
    "NewerReport", __base__=NodeReport,
    schema_minor=(SchemaMinor, written_at_minor(NEWER)),
    gpus=(list[NewerGpu], Field(default_factory=list, max_length=64)),
    rack=(str | None, None))


def test_a_producer_stamps_its_own_minor_and_minor_0_is_left_out() -> None:
    assert NewerReport.SCHEMA_MINOR == NEWER
    written = json.loads(NewerReport.model_validate_json(json.dumps(golden("node_report")))
                         .model_dump_json())
    assert written["schema_minor"] == NEWER
    assert written["rack"] is None
    assert written["gpus"][0]["fan_pct"] is None
    # ... and today's reader takes it.
    assert NodeReport.model_validate_json(json.dumps(written)).node_id == "node-002"
    assert "schema_minor" not in examples()["node_report"].model_dump_json()


def test_the_stamp_is_the_writers_class_not_what_a_parsed_message_declared() -> None:
    # A newer reader re-publishing an older message writes its own fields, so its own minor.
    older = golden("node_report") | {"schema_minor": 0}
    assert json.loads(NewerReport.model_validate_json(json.dumps(older)).model_dump_json())[
        "schema_minor"] == NEWER
    # An older reader re-publishing a newer message wrote only the fields it knows.
    passed_on = json.loads(NodeReport.model_validate_json(json.dumps(newer_report()))
                           .model_dump_json())
    assert passed_on == golden("node_report")


def test_a_versioned_model_must_declare_its_minor() -> None:
    with pytest.raises(TypeError, match="written_at_minor"):
        create_model("Unversioned", __base__=Versioned, x=(int, 0))


# ---------------------------------------------------------------- signed commands


def test_a_signed_payload_of_a_newer_minor_verifies_then_parses() -> None:
    # The signature covers the producer's exact bytes; nothing is re-serialised before the
    # check, and the unknown field is ignored only after it.
    payload = json.loads(CommandPayload.model_validate_json(json.dumps({
        "command_id": "11111111-2222-4333-8444-555555555555", "cluster_id": "local",
        "node_id": "node-002", "seq": 1, "epoch": 1, "issued_at": "2026-11-30T08:00:00Z",
        "expires_at": "2026-11-30T08:01:00Z",
        "action": {"action": "drain_node", "node_id": "node-002"}})).model_dump_json())
    payload["action"]["deadline_s"] = 30
    body = json.dumps(payload | {"schema_minor": CommandPayload.SCHEMA_MINOR + 1}).encode()
    key = Ed25519PrivateKey.generate()
    registry = KeyRegistry.of([TrustedKey("cw-test", key.public_key(), "executor")])
    command = examples()["command"]
    assert isinstance(command, Command)
    signed = command.model_copy(update={"kid": "cw-test", "payload": b64url(body),
                                        "sig": b64url(key.sign(body))})
    verified = CommandVerifier(registry).verify(signed)
    assert verified.action.action == "drain_node"
    assert verified.schema_minor == CommandPayload.SCHEMA_MINOR + 1
    forged = signed.model_copy(update={"payload": b64url(body.replace(b"30", b"31"))})
    with pytest.raises(PermanentError, match="signature"):
        CommandVerifier(registry).verify(forged)
    at_own_minor = json.dumps(payload).encode()
    with pytest.raises(ValidationError, match="deadline_s"):
        CommandVerifier(registry).verify(signed.model_copy(update={
            "payload": b64url(at_own_minor), "sig": b64url(key.sign(at_own_minor))}))

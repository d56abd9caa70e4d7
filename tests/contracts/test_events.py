"""Contract tests: every event has a golden fixture that parses, and strictness holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from common.errors import PermanentError, describe_validation_error
from common.messaging import parse_event
from schemas.catalog import TOPIC_MODELS
from schemas.events.v1 import (
    EVENT_MODELS,
    CommandPayload,
    DrainNode,
    NodeReport,
    OpsNeed,
    OpsTask,
    ProbeNode,
)
from schemas.ranges import DEFAULT_RANGES, Ranges
from tests.contracts.examples import GOLDEN, examples


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())
    return data


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_golden_fixture_parses_and_round_trips(name: str) -> None:
    model = EVENT_MODELS[name]
    data = golden(name)
    event = model.model_validate_json(json.dumps(data))
    assert event.event_type == name
    assert json.loads(event.model_dump_json()) == data
    assert event == examples()[name]


@pytest.mark.parametrize("name", ["ops_need", "ops_task"])
def test_a_message_from_before_ranges_parses_and_means_the_defaults(name: str) -> None:
    # Producers older than the `ranges` field send none: still accepted, as "the defaults".
    data = golden(name)
    del data["ranges"]
    event = EVENT_MODELS[name].model_validate_json(json.dumps(data))
    assert isinstance(event, OpsNeed | OpsTask)
    assert event.ranges is None
    if isinstance(event, OpsTask):
        assert event.ranges_in_force == DEFAULT_RANGES == Ranges()


def test_ranges_on_the_wire_are_checked_like_the_analyzer_checks_them() -> None:
    data = golden("ops_need")
    data["ranges"]["pool"]["low_exit"] = 90.0  # an exit outside its entry: not a range
    with pytest.raises(ValidationError, match="low_enter <= low_exit < high_exit"):
        EVENT_MODELS["ops_need"].model_validate_json(json.dumps(data))


def test_every_topic_has_a_model_and_every_model_a_golden() -> None:
    assert set(EVENT_MODELS) == {p.stem for p in GOLDEN.glob("*.json")}
    assert set(TOPIC_MODELS.values()) <= set(EVENT_MODELS.values())


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_unknown_field_is_rejected(name: str) -> None:
    data = golden(name) | {"cmd": "rm -rf /"}
    with pytest.raises(ValidationError) as err:
        EVENT_MODELS[name].model_validate_json(json.dumps(data))
    assert describe_validation_error(err.value).reason == "extra_forbidden"


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_unknown_schema_version_is_rejected_with_a_clear_reason(name: str) -> None:
    data = golden(name) | {"schema_version": 99}
    with pytest.raises(ValidationError) as err:
        EVENT_MODELS[name].model_validate_json(json.dumps(data))
    assert describe_validation_error(err.value).reason == "unsupported_version"


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_oversize_subject_is_rejected(name: str) -> None:
    data = golden(name) | {"subject": "n" * 129}
    with pytest.raises(ValidationError):
        EVENT_MODELS[name].model_validate_json(json.dumps(data))


def report_with_gpu(**gpu_changes: Any) -> str:
    data = golden("node_report")
    data["gpus"][0].update(gpu_changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("raw_value", "reason"),
    [
        ("NaN", "finite_number"),
        ("Infinity", "finite_number"),
        ("1e309", "finite_number"),
        ('"50"', "float_type"),
        ('"high"', "float_type"),
        ("-1", "greater_than_equal"),
        ("100.5", "less_than_equal"),
    ],
)
def test_bad_utilisation_values_are_rejected(raw_value: str, reason: str) -> None:
    body = report_with_gpu(utilization_pct=0.0).replace(
        '"utilization_pct": 0.0', f'"utilization_pct": {raw_value}'
    )
    with pytest.raises(ValidationError) as err:
        NodeReport.model_validate_json(body)
    assert reason in {e["type"] for e in err.value.errors()}


def test_memory_used_above_total_is_rejected() -> None:
    with pytest.raises(ValidationError, match="memory_used_mib exceeds"):
        NodeReport.model_validate_json(report_with_gpu(memory_used_mib=90_000))


def test_implausible_temperature_is_rejected() -> None:
    with pytest.raises(ValidationError):
        NodeReport.model_validate_json(report_with_gpu(temperature_c=151.0))


def test_oversize_gpu_list_is_rejected() -> None:
    data = golden("node_report")
    data["gpus"] = data["gpus"] * 65
    with pytest.raises(ValidationError) as err:
        NodeReport.model_validate_json(json.dumps(data))
    assert "too_long" in {e["type"] for e in err.value.errors()}


def test_subject_must_be_the_node() -> None:
    data = golden("node_report") | {"subject": "node-999"}
    with pytest.raises(ValidationError, match="subject must equal node_id"):
        NodeReport.model_validate_json(json.dumps(data))


def payload(**changes: Any) -> dict[str, Any]:
    data = json.loads(examples()["task_scheduled"].model_dump_json())
    base: dict[str, Any] = {
        "command_id": "11111111-2222-4333-8444-555555555555", "cluster_id": "local",
        "node_id": "node-002", "seq": 1,
        "epoch": 1, "issued_at": data["occurred_at"], "expires_at": "2026-11-30T08:01:00Z",
        "action": {"action": "drain_node", "node_id": "node-002"},
    }
    return base | changes


def test_command_payload_parses() -> None:
    assert CommandPayload.model_validate_json(json.dumps(payload())).action.action == "drain_node"


@pytest.mark.parametrize(
    ("action", "error_type"),
    [
        ({"action": "exec_shell", "node_id": "node-002"}, "union_tag_invalid"),
        ({"action": "stop_job", "node_id": "node-002", "job_id": "j1; rm -rf /"},
         "string_pattern_mismatch"),
        ({"action": "stop_job", "node_id": "node-002", "job_id": "../../etc"},
         "string_pattern_mismatch"),
        ({"action": "drain_node", "node_id": "node-002", "force": True}, "extra_forbidden"),
        ({"action": "set_resources", "node_id": "node-002", "job_id": "j1", "gpus": 10**9,
          "memory_mib": 1}, "less_than_equal"),
    ],
)
def test_commands_outside_the_allow_list_are_rejected(action: dict[str, Any],
                                                       error_type: str) -> None:
    with pytest.raises(ValidationError) as err:
        CommandPayload.model_validate_json(json.dumps(payload(action=action)))
    assert error_type in {e["type"] for e in err.value.errors()}


def test_the_builder_addresses_the_actions_node_and_orders_only_when_given_a_seq() -> None:
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    common: dict[str, Any] = {"cluster_id": "local", "command_id": uuid4(), "issued_at": at,
                              "expires_at": at + timedelta(seconds=60)}
    probe = CommandPayload.for_action(ProbeNode(node_id="node-002"), **common)
    assert (probe.cluster_id, probe.node_id, probe.seq, probe.epoch) == (
        "local", "node-002", 0, 1)
    drain = CommandPayload.for_action(DrainNode(node_id="node-002"), seq=7, epoch=3, **common)
    assert (drain.seq, drain.epoch) == (7, 3)


def test_command_for_another_node_in_the_action_is_rejected() -> None:
    bad = payload(action={"action": "drain_node", "node_id": "node-001"})
    with pytest.raises(ValidationError, match=r"action\.node_id must equal node_id"):
        CommandPayload.model_validate_json(json.dumps(bad))


def test_deeply_nested_json_is_a_permanent_error_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises((PermanentError, ValidationError)):
        parse_event(NodeReport, body, b"node-002", limit=1_000_000)


def test_size_limit_applies_before_parsing() -> None:
    with pytest.raises(PermanentError) as err:
        parse_event(NodeReport, b"x" * 70_000, b"node-002", limit=65_536)
    assert err.value.reason == "oversize"


def test_kafka_key_must_match_the_subject() -> None:
    body = json.dumps(golden("node_report")).encode()
    with pytest.raises(PermanentError) as err:
        parse_event(NodeReport, body, b"node-001", limit=65_536)
    assert err.value.reason == "key_mismatch"
    assert parse_event(NodeReport, body, b"node-002", limit=65_536).node_id == "node-002"


def test_a_keyless_message_is_refused_not_waved_past_the_key_check() -> None:
    body = json.dumps(golden("node_report")).encode()
    with pytest.raises(PermanentError) as err:
        parse_event(NodeReport, body, None, limit=65_536)
    assert err.value.reason == "key_missing"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_never_escape_as_anything_but_a_validation_failure(body: bytes) -> None:
    with pytest.raises((PermanentError, ValidationError)):
        parse_event(NodeReport, body, b"node-002", limit=65_536)


def test_an_offline_step_from_before_the_taint_effect_means_no_schedule() -> None:
    # Producers older than `effect` send none: still accepted, as the default NoSchedule.
    data = golden("ops_task")
    offline = data["steps"][1]["action"]
    assert offline["action"] == "offline_node"
    del offline["effect"]
    task = OpsTask.model_validate_json(json.dumps(data))
    action = task.steps[1].action
    assert action.action == "offline_node"
    assert action.effect == "NoSchedule"
    offline["effect"] = "NoExecute"
    action = OpsTask.model_validate_json(json.dumps(data)).steps[1].action
    assert action.action == "offline_node"
    assert action.effect == "NoExecute"
    offline["effect"] = "PreferNoSchedule"
    with pytest.raises(ValidationError):
        OpsTask.model_validate_json(json.dumps(data))

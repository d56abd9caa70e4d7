"""Contract tests of the ML routing events: old messages stay valid, new ones are strict."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.catalog import TOPIC_MODELS
from schemas.events.v1 import (
    CommandPayload,
    CommandResult,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    NodeReport,
)
from schemas.topics import Topic
from tests.contracts.examples import GOLDEN


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())
    return data


def test_every_ml_topic_carries_its_event() -> None:
    assert TOPIC_MODELS[Topic.ML_TASKS_SUBMITTED] is MlTaskSubmitted
    assert TOPIC_MODELS[Topic.ML_TASKS_OUTCOMES] is MlTaskOutcome
    assert TOPIC_MODELS[Topic.ML_DECISIONS] is ModelSelected


def test_a_report_from_an_agent_without_models_is_still_valid() -> None:
    data = golden("node_report")
    del data["models"]
    assert NodeReport.model_validate_json(json.dumps(data)).models == []


def test_a_command_result_from_before_inference_is_still_valid() -> None:
    data = golden("command_result")
    del data["inference"]
    assert CommandResult.model_validate_json(json.dumps(data)).inference is None


def test_served_model_state_is_checked() -> None:
    data = golden("node_report")
    data["models"][0]["state"] = "warming"
    with pytest.raises(ValidationError):
        NodeReport.model_validate_json(json.dumps(data))


def inference_payload(**action: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "action": "run_inference", "node_id": "node-002",
        "task_id": "7a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "attempt": 1, "task_type": "digits",
        "model": "digits-mlp", "version": "2", "input": [0.0] * 64, "timeout_s": 2.0,
    }
    return {"command_id": "22222222-3333-4444-8555-666666666666", "cluster_id": "local",
            "node_id": "node-002", "seq": 0, "epoch": 1, "issued_at": "2026-11-30T08:00:00Z",
            "expires_at": "2026-11-30T08:00:05Z", "action": base | action}


def test_run_inference_is_a_command_action() -> None:
    payload = CommandPayload.model_validate_json(json.dumps(inference_payload()))
    assert payload.action.action == "run_inference"


@pytest.mark.parametrize(
    ("change", "error_type"),
    [
        ({"input": []}, "too_short"),
        ({"input": [0.0] * 1_025}, "too_long"),
        ({"input": ["1"]}, "float_type"),
        ({"attempt": 0}, "greater_than_equal"),
        ({"version": "1:2"}, "string_pattern_mismatch"),
        ({"model": "../etc"}, "string_pattern_mismatch"),
    ],
)
def test_bad_run_inference_actions_are_rejected(change: dict[str, Any], error_type: str) -> None:
    with pytest.raises(ValidationError) as err:
        CommandPayload.model_validate_json(json.dumps(inference_payload(**change)))
    assert error_type in {e["type"] for e in err.value.errors()}


def test_a_submission_must_leave_time_before_its_deadline() -> None:
    data = golden("ml_task_submitted") | {"deadline": golden("ml_task_submitted")["occurred_at"]}
    with pytest.raises(ValidationError, match="deadline must be after"):
        MlTaskSubmitted.model_validate_json(json.dumps(data))


def test_a_submission_is_keyed_by_its_task() -> None:
    data = golden("ml_task_submitted") | {"subject": "other"}
    with pytest.raises(ValidationError, match="subject must equal task_id"):
        MlTaskSubmitted.model_validate_json(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"outcome": "failed"}, "needs a cause"),
        ({"cause": "model_fault"}, "needs a cause"),
        ({"final": False}, "final outcomes"),
        ({"state": "running"}, "final outcomes"),
    ],
)
def test_outcomes_are_consistent(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MlTaskOutcome.model_validate_json(json.dumps(golden("ml_task_outcome") | change))


def test_a_waiting_decision_chooses_nothing() -> None:
    data = golden("model_selected") | {"status": "saturated"}
    with pytest.raises(ValidationError, match="a choice"):
        ModelSelected.model_validate_json(json.dumps(data))
    waiting = data | {"chosen": None, "model": None, "version": None, "family": None,
                      "node": None, "command_id": None}
    assert ModelSelected.model_validate_json(json.dumps(waiting)).chosen is None

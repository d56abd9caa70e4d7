"""The checkpoint protocol's pure parts: who opts in, what the request says, which answer
counts, and that a resend finds its own request instead of asking again."""

from __future__ import annotations

import json

import pytest

from schemas.kubernetes import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_REQUEST_ANNOTATION,
    CHECKPOINT_TIMEOUT_ANNOTATION,
    RESUMED_FROM_ANNOTATION,
)
from services.backends.base import StepRef
from services.backends.kubernetes.checkpoint import (
    MAX_CHECKPOINT_TIMEOUT_S,
    CheckpointAck,
    CheckpointRequest,
    ack_of,
    opt_in_timeout,
    plan_checkpoint,
    request_of,
    request_patch,
    resumed_from,
)

STEP = StepRef(task_id="task-1", step="0:drain")
NOW = 1_800_000_000.0
OPTED_IN = {CHECKPOINT_TIMEOUT_ANNOTATION: "30"}


@pytest.mark.parametrize(("value", "timeout"), [
    ("30", 30.0), ("2.5", 2.5), ("86400", MAX_CHECKPOINT_TIMEOUT_S),
    ("0", None), ("-4", None), ("soon", None), ("nan", None), ("inf", None),
])
def test_a_pod_opts_in_with_a_positive_timeout(value: str, timeout: float | None) -> None:
    assert opt_in_timeout({CHECKPOINT_TIMEOUT_ANNOTATION: value}) == timeout


def test_a_pod_that_does_not_opt_in_is_not_asked() -> None:
    assert opt_in_timeout({}) is None
    assert plan_checkpoint({"app": "train"}, STEP, NOW) is None


def test_the_first_ask_writes_a_request_naming_the_task_and_step() -> None:
    plan = plan_checkpoint(OPTED_IN, STEP, NOW)
    assert plan is not None
    assert plan.ask
    assert plan.request == CheckpointRequest(id="task-1/0:drain", task_id="task-1",
                                             step="0:drain", requested_at=NOW)
    assert plan.deadline == NOW + 30.0
    patch = request_patch(plan.request, "77")
    assert patch["metadata"]["resourceVersion"] == "77"
    written = json.loads(patch["metadata"]["annotations"][CHECKPOINT_REQUEST_ANNOTATION])
    assert written == {"id": "task-1/0:drain", "task_id": "task-1", "step": "0:drain",
                       "requested_at": NOW}
    # Only the request annotation: the pod's other annotations are the workload's.
    assert list(patch["metadata"]["annotations"]) == [CHECKPOINT_REQUEST_ANNOTATION]


def test_a_resend_finds_its_own_request_and_waits_from_when_it_asked() -> None:
    first = plan_checkpoint(OPTED_IN, STEP, NOW)
    assert first is not None
    on_pod = {**OPTED_IN, CHECKPOINT_REQUEST_ANNOTATION: first.request.to_json()}
    again = plan_checkpoint(on_pod, STEP, NOW + 12.0)
    assert again is not None
    assert not again.ask
    assert again.request == first.request
    assert again.deadline == NOW + 30.0
    # Another task's (or step's) request is not ours: ask anew.
    other = plan_checkpoint(on_pod, StepRef("task-2", "0:drain"), NOW + 12.0)
    assert other is not None
    assert other.ask
    assert other.request.requested_at == NOW + 12.0


def test_an_unreadable_request_is_none_and_is_asked_again() -> None:
    broken = {**OPTED_IN, CHECKPOINT_REQUEST_ANNOTATION: "{not json"}
    assert request_of(broken) is None
    plan = plan_checkpoint(broken, STEP, NOW)
    assert plan is not None
    assert plan.ask


def ack(value: object) -> dict[str, str]:
    return {CHECKPOINT_ANNOTATION: json.dumps(value)}


@pytest.mark.parametrize(("annotations", "answer"), [
    (ack({"request": "task-1/0:drain", "step": 1200}), CheckpointAck("task-1/0:drain", 1200)),
    (ack({"request": "task-1/0:drain", "step": "1200", "path": "s3://ckpt/1200"}),
     CheckpointAck("task-1/0:drain", 1200, "s3://ckpt/1200")),
    # An answer to an earlier drain's request is not this one's.
    (ack({"request": "task-0/0:drain", "step": 900}), None),
    (ack({"request": "task-1/0:drain"}), None),
    (ack({"request": "task-1/0:drain", "step": True}), None),
    (ack({"request": "task-1/0:drain", "step": "latest"}), None),
    (ack(["task-1/0:drain", 1200]), None),
    ({CHECKPOINT_ANNOTATION: "saved"}, None),
    ({}, None),
])
def test_only_an_answer_to_this_request_with_a_step_counts(
    annotations: dict[str, str], answer: CheckpointAck | None,
) -> None:
    assert ack_of(annotations, "task-1/0:drain") == answer


def test_a_replacement_may_say_which_step_it_resumed_from() -> None:
    assert resumed_from({RESUMED_FROM_ANNOTATION: "1200"}) == 1200
    assert resumed_from({RESUMED_FROM_ANNOTATION: "the last one"}) is None
    assert resumed_from({}) is None

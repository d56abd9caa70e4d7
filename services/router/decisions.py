"""Pure translations between the selector's values and the events on the wire.

The selector (services/router/policy/) speaks in arms, `<model>:<version>` names, epoch
seconds and its own cause words; the events speak in model, version and node, UUIDs and aware
datetimes. Nothing here decides anything: the selector does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid5

from schemas import ids
from schemas.envelope import SHORT_TEXT_MAX
from schemas.events.v1 import (
    CandidateVerdict,
    CommandPayload,
    CommandResult,
    InferenceCause,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    RunInference,
    SelectionInputs,
)
from services.router.policy.attribution import Cause, attribute
from services.router.policy.selector import Avoid, Decision, Task, replay
from services.router.records import AttemptRecord, TaskRecord
from services.router.registry import split_model

SOURCE = "router"

# The router's words for what went wrong -> the selector's attribution. `unavailable` (the
# router's view was stale: the model was not ready there, the agent refused the command)
# is, like a capacity refusal, nobody's fault: another arm is tried.
POLICY_CAUSE: dict[InferenceCause, Cause] = {
    "model_fault": "model_fault",
    "node_fault": "node_fault",
    "timeout": "timeout",
    "unknown": "unknown",
    "bad_input": "bad_input",
    "capacity": "capacity",
    "deadline_too_short": "deadline_too_short",
    "unavailable": "capacity",
    "no_candidates": "capacity",
}

Attribution = Literal["model", "node", "both", "neither"]


def attributed_to(cause: InferenceCause | None) -> Attribution | None:
    """What a failure with `cause` counted against (None for a success)."""
    if cause is None:
        return None
    blame = attribute(POLICY_CAUSE[cause])
    model, node = blame.model or blame.family, blame.node
    if model and node:
        return "both"
    return "model" if model else "node" if node else "neither"


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def command_id_for(task_id: UUID, attempt: int) -> UUID:
    """The run_inference command of an attempt: the same id if the attempt is sent again."""
    return uuid5(ids.ML_ROUTING, f"{task_id}:{attempt}:command")


def outcome_id_for(task_id: UUID, attempt: int, final: bool) -> UUID:
    return uuid5(ids.ML_ROUTING, f"{task_id}:{attempt}:outcome:{int(final)}")


def policy_task(record: TaskRecord) -> Task:
    """The task as the selector sees it, for its next attempt."""
    task = record.task
    return Task(task_id=str(task.task_id), task_type=task.task_type, priority=task.priority,
                deadline=epoch(task.deadline), critical=task.critical,
                attempt=record.next_attempt, avoid=Avoid.from_dict(record.avoid))


def cause_of(result: CommandResult) -> InferenceCause | None:
    """Why an agent's answer failed (None: it succeeded).

    A failure without an inference output (an injected or unexpected failure) is `unknown`,
    a rejected command (expired, refused) `unavailable`.
    """
    if result.outcome == "succeeded":
        return result.inference.cause if result.inference is not None else None
    if result.outcome == "rejected":
        return "unavailable"
    if result.inference is not None and result.inference.cause is not None:
        return result.inference.cause
    return "unknown"


def _short(value: str) -> str:
    return value if len(value) <= SHORT_TEXT_MAX else value[: SHORT_TEXT_MAX - 1] + "~"


def _compact_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The decision's inputs with zero statistics left out (the codec reads them as 0)."""
    snapshot = inputs["snapshot"]
    return inputs | {"snapshot": {k: v for k, v in snapshot.items() if v != 0.0}}


def selection_event(decision: Decision, task: MlTaskSubmitted, attempt: int,
                    command_id: UUID | None, event_id: UUID) -> ModelSelected:
    """The event of one decision (a choice, or a wait)."""
    record = decision.to_dict()
    chosen = decision.chosen
    name = version = None
    if chosen is not None:
        name, version = split_model(chosen.model)
    candidates = [CandidateVerdict.model_validate(view | {"reason": _short(view["reason"])})
                  for view in record["candidates"]]
    return ModelSelected(
        event_id=event_id, source=SOURCE, occurred_at=at(decision.now),
        cluster_id=task.cluster_id, subject=str(task.task_id),
        correlation_id=str(task.event_id), task_id=task.task_id, task_type=task.task_type,
        attempt=attempt, status=decision.status, chosen=record["chosen"], model=name,
        version=version, family=chosen.family if chosen else None,
        node=chosen.node if chosen else None, command_id=command_id, probe=decision.probe,
        reason=_short(decision.reason), policy_version=decision.policy_version,
        now=decision.now, seed=decision.seed, candidates=candidates,
        inputs=SelectionInputs.model_validate(_compact_inputs(record["inputs"])),
    )


def decision_attributes(decision: Decision, task_id: UUID, attempt: int,
                        candidates: int) -> dict[str, str | int | bool]:
    """What a routing decision's span says: the attempt, the verdict and, for a choice, the
    model, the node and the command it was sent."""
    attributes: dict[str, str | int | bool] = {
        "ml.attempt": attempt, "ml.decision.status": decision.status,
        "ml.decision.reason": _short(decision.reason), "ml.decision.probe": decision.probe,
        "ml.candidates": candidates}
    chosen = decision.chosen
    if chosen is not None:
        name, version = split_model(chosen.model)
        attributes.update({"ml.model": name, "ml.model.version": version,
                           "node.id": chosen.node,
                           "command.id": str(command_id_for(task_id, attempt))})
    return attributes


def replay_event(event: ModelSelected) -> Decision:
    """The decision again, from the event alone."""
    return replay({"inputs": event.inputs.model_dump(mode="json")})


def inference_payload(task: MlTaskSubmitted, attempt: AttemptRecord, now: float,
                      leeway_s: float = 1.0) -> CommandPayload:
    """The signed part of an attempt's run_inference command.

    Outside the node's command ordering; it expires shortly after the attempt's deadline,
    when nobody waits for its answer.
    """
    timeout_s = max(attempt.deadline - now, 0.001)
    return CommandPayload.for_action(
        RunInference(node_id=attempt.node, task_id=task.task_id, attempt=attempt.n,
                     task_type=task.task_type, model=attempt.model,
                     version=attempt.version, input=task.input,
                     timeout_s=min(timeout_s, 3_600.0)),
        cluster_id=task.cluster_id, command_id=attempt.command_id, issued_at=at(now),
        expires_at=at(attempt.deadline) + timedelta(seconds=leeway_s), task_id=task.task_id,
    )


def outcome_event(record: TaskRecord, attempt: AttemptRecord | None, *, final: bool,
                  state: Literal["running", "succeeded", "failed"], reason: str,
                  cause: InferenceCause | None = None, occurred: float) -> MlTaskOutcome:
    """The outcome of one attempt (or, with no attempt, of a task that never got one)."""
    task = record.task
    result = attempt.result if attempt is not None else None
    if attempt is not None and result is not None:
        cause = result.cause
    number = attempt.n if attempt is not None else record.next_attempt
    latency = None
    if attempt is not None and result is not None:
        latency = round(max(result.ended_at - attempt.decided_at, 0.0) * 1000.0, 3)
    return MlTaskOutcome(
        event_id=outcome_id_for(task.task_id, number, final), source=SOURCE,
        occurred_at=at(occurred), cluster_id=task.cluster_id, subject=str(task.task_id),
        correlation_id=str(task.event_id), task_id=task.task_id, task_type=task.task_type,
        attempt=number,
        node_id=attempt.node if attempt else None, model=attempt.model if attempt else None,
        version=attempt.version if attempt else None,
        family=attempt.family if attempt else None,
        command_id=attempt.command_id if attempt else None,
        outcome="succeeded" if cause is None else "failed", cause=cause,
        attributed_to=attributed_to(cause),
        latency_ms=min(latency, 3_600_000.0) if latency is not None else None,
        node_latency_ms=(min(result.node_latency_ms, 3_600_000.0)
                         if result is not None and result.node_latency_ms is not None
                         else None),
        prediction=result.prediction if result else None,
        confidence=result.confidence if result else None,
        final=final, state=state, reason=_short(reason),
    )

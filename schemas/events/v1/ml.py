"""ML task routing: a user's task, the router's selection decision, and each attempt's
outcome."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field, StringConstraints, model_validator

from schemas.envelope import Envelope, Identifier, ShortText, Strict
from schemas.events.v1.values import Attempt, InferenceCause, MlInput, ModelVersion, Priority

MlTaskState = Literal["submitted", "running", "succeeded", "failed"]


class MlTaskSubmitted(Envelope):
    """A user's ML task: run `input` through some model serving `task_type` before `deadline`.

    The subject is the task id. The router chooses the model (and version, and node).
    """

    event_type: Literal["ml_task_submitted"] = "ml_task_submitted"
    task_id: UUID
    task_type: Identifier
    input: MlInput
    deadline: AwareDatetime = Field(description="The task must have succeeded by then.")
    priority: Priority = 5
    critical: bool = Field(
        default=False,
        description="Choose by a pessimistic bound of each model's success rate, not a sample.")
    submitted_by: Identifier

    @model_validator(mode="after")
    def _deadline_after_submission(self) -> MlTaskSubmitted:
        if self.deadline <= self.occurred_at:
            raise ValueError("deadline must be after occurred_at")
        if self.subject != str(self.task_id):
            raise ValueError("subject must equal task_id")
        return self


# The selector names a model version `<model>:<version>` and an arm `arm:<model>@<node>`.
PolicyModel = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9_.-]{1,128}:[A-Za-z0-9_.-]{1,32}$")]
ArmKey = Annotated[str, StringConstraints(min_length=1, max_length=300)]
StatField = Annotated[str, StringConstraints(min_length=1, max_length=320)]
Finite = Annotated[float, Field(ge=-1e15, le=1e15)]
SelectionStatus = Literal["selected", "fallback", "panic", "saturated", "no_candidates"]
ConfigValue = Annotated[str, Field(max_length=64)] | int | float | bool | None


class SelectionAvoid(Strict):
    """What a retry should not use again (the selector relaxes it rather than fail)."""

    arms: list[ArmKey] = Field(default_factory=list, max_length=64)
    nodes: list[Identifier] = Field(default_factory=list, max_length=64)
    models: list[PolicyModel] = Field(default_factory=list, max_length=64)


class SelectionTask(Strict):
    """The task as the selector saw it (deadline in epoch seconds, like `now`)."""

    task_id: ShortText
    task_type: Identifier
    priority: Priority
    deadline: Finite | None
    critical: bool
    attempt: Attempt
    avoid: SelectionAvoid


class SelectionCandidate(Strict):
    """One candidate given to the selector: a model version loaded on a node."""

    model: PolicyModel
    node: Identifier
    family: Identifier
    group: Annotated[int, Field(ge=0, le=64)] = Field(description="Fallback order, 0 first.")
    ready: bool
    predecessor: PolicyModel | None = None
    max_ongoing: Annotated[int, Field(ge=1, le=1_024)] | None = None


class SelectionInputs(Strict):
    """Everything the selector read: replaying these reproduces the decision exactly."""

    task: SelectionTask
    candidates: list[SelectionCandidate] = Field(max_length=64)
    snapshot: dict[StatField, Finite] = Field(
        max_length=4_096,
        description="The statistics read, flat (`<key>|<field>`); zero fields are left out.")
    now: Finite
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    config: dict[Identifier, ConfigValue] = Field(max_length=128)


class CandidateVerdict(Strict):
    """One candidate's statistics, whether it was eligible and why, and its score."""

    arm: ArmKey
    model: PolicyModel
    node: Identifier
    family: Identifier
    group: Annotated[int, Field(ge=0, le=64)]
    eligible: bool
    reason: ShortText
    state: Literal["closed", "cold", "open", "half_open"]
    alpha: Finite
    beta: Finite
    n_eff: Finite
    mean: Finite
    lower: Finite
    upper: Finite
    prior_mean: Finite
    model_mean: Finite
    node_mean: Finite
    inflight: Annotated[int, Field(ge=0, le=1_000_000)]
    limit: Annotated[int, Field(ge=0, le=1_000_000)]
    latency_s: Finite
    on_time: Finite
    sample: Finite | None
    score: Finite | None
    avoided: Annotated[int, Field(ge=0, le=2)]


class ModelSelected(Envelope):
    """A selection decision: every candidate with its statistics and verdict, and the choice.

    `inputs` holds everything the selector read (the task, the candidates, the statistics,
    the time, the seed and the configuration), so replaying the event reproduces the decision
    (`services.router.policy.selector.replay`). `saturated` and `no_candidates` decisions
    choose nothing: the task waits and is selected again.
    """

    event_type: Literal["model_selected"] = "model_selected"
    task_id: UUID
    task_type: Identifier
    attempt: Attempt
    status: SelectionStatus
    chosen: ArmKey | None = None
    model: Identifier | None = None
    version: ModelVersion | None = None
    family: Identifier | None = None
    node: Identifier | None = None
    command_id: UUID | None = Field(default=None,
                                    description="The run_inference command sent, if any.")
    probe: bool = Field(default=False, description="The choice is a half-open trial.")
    reason: ShortText
    policy_version: Annotated[str, Field(max_length=64)]
    now: Finite
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    candidates: list[CandidateVerdict] = Field(max_length=64)
    inputs: SelectionInputs

    @model_validator(mode="after")
    def _choice_is_consistent(self) -> ModelSelected:
        chose = self.status not in ("saturated", "no_candidates")
        if chose != (self.chosen is not None and self.node is not None
                     and self.model is not None):
            raise ValueError("a choice (chosen, model, node) exactly when the status chose one")
        return self


class MlTaskOutcome(Envelope):
    """How one attempt of an ML task ended, and whether the task is now final.

    One per attempt (the router publishes it when the agent answers, or when the attempt
    times out); `final` is set on the last one, with the task's final state. A task that
    could not be sent anywhere ends with an outcome of attempt 1 without a node.
    """

    event_type: Literal["ml_task_outcome"] = "ml_task_outcome"
    task_id: UUID
    task_type: Identifier
    attempt: Attempt
    node_id: Identifier | None = None
    model: Identifier | None = None
    version: ModelVersion | None = None
    family: Identifier | None = None
    command_id: UUID | None = None
    outcome: Literal["succeeded", "failed"]
    cause: InferenceCause | None = None
    attributed_to: Literal["model", "node", "both", "neither"] | None = Field(
        default=None, description="What the failure counted against in the statistics.")
    latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] | None = Field(
        default=None, description="From dispatch to the answer, as the router measured it.")
    node_latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] | None = None
    prediction: Annotated[int, Field(ge=-(2**31), le=2**31)] | None = None
    confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    final: bool = Field(description="No attempt follows: `state` is the task's final state.")
    state: MlTaskState = Field(description="The task's state after this outcome.")
    reason: ShortText = ""

    @model_validator(mode="after")
    def _consistent(self) -> MlTaskOutcome:
        if (self.outcome == "failed") != (self.cause is not None):
            raise ValueError("a failed outcome needs a cause, and only a failed one")
        if self.final != (self.state in ("succeeded", "failed")):
            raise ValueError("final outcomes carry the final state; others running")
        return self

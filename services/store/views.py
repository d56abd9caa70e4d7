"""What the query layer returns: JSON-ready pydantic models the API can answer with as is.

Times are aware UTC datetimes. Fields of a task that only its `created` event carries (pool,
target, need, template, plan...) are None while the store holds a stub made from a later
event that arrived first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, computed_field

from schemas.events.v1 import PoolPlan, StepState, TaskState

# A step no event has been recorded for yet.
StepRowState = StepState | Literal["pending"]

_ROW = ConfigDict(frozen=True, from_attributes=True)


class TaskRow(BaseModel):
    """One task in a list."""

    model_config = _ROW

    task_id: UUID
    parent_task_id: UUID | None
    cluster_id: str
    pool: str | None
    target: str | None
    need_id: UUID | None
    need_kind: str | None
    kind: str | None = Field(description="The action type the task counts as "
                             "(its breaker and budget); the need kind unless set.")
    template: str | None
    priority: int | None
    dry_run: bool
    state: TaskState
    reason: str = Field(description="The reason of the latest transition.")
    step_count: int | None = Field(description="Steps in the plan; None until it is known.")
    current_step: int | None = Field(description="The step the latest step event was about.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = Field(description="When it reached its final state.")


class StepRow(BaseModel):
    """One step of a task: its plan and what happened to it."""

    model_config = _ROW

    task_id: UUID
    index: int
    name: str | None
    action: str | None
    action_args: dict[str, Any] | None
    guard: str | None
    node_id: str | None
    timeout_s: float | None
    max_attempts: int | None
    state: StepRowState
    command_id: UUID | None = Field(description="The command of its latest attempt.")
    attempts: int
    outputs: dict[str, Any] = Field(description="Its latest attempt's outputs merged, later "
                                    "events winning: results, initial and target resources.")
    started_at: datetime | None
    ended_at: datetime | None
    reason: str


class TransitionRow(BaseModel):
    """One recorded TaskEvent."""

    model_config = _ROW

    id: int
    event_id: UUID
    task_id: UUID
    occurred_at: datetime
    state: TaskState
    previous_state: TaskState | None
    step_index: int | None
    step_state: StepState | None
    command_id: UUID | None
    actor: str
    reason: str
    outputs: dict[str, Any]


class TaskDetail(TaskRow):
    """A task with everything recorded about it."""

    evidence: list[dict[str, Any]] = Field(description="Why its need was raised.")
    plan: dict[str, Any] | None = Field(description="The OpsTask as created (JSON).")
    steps: list[StepRow]
    transitions: list[TransitionRow] = Field(description="Oldest first.")
    children: list[TaskRow] = Field(description="Its child tasks, oldest first.")

    # From the plan (no column of their own: the plan is recorded whole).
    @computed_field(  # type: ignore[prop-decorator]
        description="How many ops the task executes (nodes taken offline, nodes added, jobs "
        "moved); None: computed at run time, or no plan recorded.")
    @property
    def execution_count(self) -> int | None:
        count = (self.plan or {}).get("execution_count")
        return count if isinstance(count, int) else None

    @computed_field(  # type: ignore[prop-decorator]
        description="Each step's execution count, by index (None: computed when it runs).")
    @property
    def step_execution_counts(self) -> list[int | None]:
        return [s.get("execution_count") for s in (self.plan or {}).get("steps", [])]

    @computed_field(  # type: ignore[prop-decorator]
        description="Its template's concurrency and relations (None: a child task, or no "
        "plan recorded).")
    @property
    def relations(self) -> dict[str, Any] | None:
        relations = (self.plan or {}).get("relations")
        return relations if isinstance(relations, dict) else None


class AuditRow(BaseModel):
    """One entry of the audit log with its place in the hash chain."""

    model_config = _ROW

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    reason: str
    result: str
    detail: dict[str, Any]
    prev_hash: str
    hash: str


# ------------------------------------------------------------------ ML tasks

MlTaskState = Literal["submitted", "running", "succeeded", "failed"]


class MlTaskRow(BaseModel):
    """One ML task in a list."""

    model_config = _ROW

    task_id: UUID
    cluster_id: str
    task_type: str | None = Field(description="None while only a later event was recorded.")
    state: MlTaskState
    priority: int | None
    critical: bool
    submitted_by: str | None
    deadline: datetime | None
    attempts: int = Field(description="Attempts sent to a node so far.")
    node_id: str | None = Field(description="Where the latest attempt ran.")
    model: str | None
    version: str | None
    family: str | None
    cause: str | None = Field(description="Why the latest attempt (or the task) failed.")
    reason: str
    prediction: int | None
    confidence: float | None
    latency_ms: float | None = Field(description="Dispatch to answer of the final attempt.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class MlAttemptRow(BaseModel):
    """One attempt: the decision behind it (every candidate, and why) and how it ended."""

    model_config = _ROW

    attempt: int
    status: str = Field(description="The decision: selected, fallback, panic, saturated, "
                        "no_candidates.")
    node_id: str | None
    model: str | None
    version: str | None
    family: str | None
    command_id: UUID | None
    probe: bool
    decision_reason: str
    candidates: list[dict[str, Any]] = Field(
        description="Each candidate's statistics, eligibility and reason, and score.")
    decided_at: datetime | None
    outcome: str | None
    cause: str | None
    attributed_to: str | None
    latency_ms: float | None
    node_latency_ms: float | None
    prediction: int | None
    confidence: float | None
    ended_at: datetime | None
    reason: str


class MlTaskDetail(MlTaskRow):
    """An ML task with its input and every attempt."""

    input: list[float] | None
    attempt_list: list[MlAttemptRow] = Field(description="Oldest first.")


class AlertRow(BaseModel):
    """One alert: its state, its acknowledgement, and whether Alertmanager has it."""

    model_config = _ROW

    cluster_id: str
    dedup_key: str
    kind: str
    severity: str
    status: Literal["firing", "resolved"]
    subject: str
    source: str
    message: str
    resolution: str | None
    starts_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    occurrences: int
    acknowledged_by: str | None
    acknowledged_at: datetime | None
    ack_reason: str | None
    delivered_at: datetime | None


class PlanRow(BaseModel):
    """One recorded capacity plan of a pool (the CapacityPlan event's body)."""

    model_config = _ROW

    event_id: UUID
    cluster: str
    pool: str
    plan: PoolPlan

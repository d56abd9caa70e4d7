"""Ops tasks and their lifecycle: typed steps, the task, its scheduling, its transitions, an
operator's control, and the alerts a human should see."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field, model_validator

from schemas.envelope import Envelope, Identifier, Reason, ShortText, Strict
from schemas.events.v1.actions import StepAction
from schemas.events.v1.analysis import Evidence
from schemas.events.v1.values import NeedKind, OutputValue, Priority, StepIndex
from schemas.ranges import DEFAULT_RANGES, Ranges

TaskState = Literal[
    "created", "queued", "dispatched", "running", "paused", "succeeded", "failed", "terminated"
]
# What an open circuit breaker of a task's kind stops: the kind in its cluster, the failing
# node (ops tasks and ML routing), or the whole cluster's automation.
BreakerScope = Literal["kind", "node", "cluster"]
# How many ops (nodes, jobs) a step or a task executes.
ExecutionCount = Annotated[int, Field(ge=0, le=10_000)]
StepState = Literal["scheduled", "started", "completed", "failed", "skipped"]

# Conditions re-checked on fresh state just before a step runs; a step whose guard does not
# hold is skipped, with the reason, instead of acting on a stale plan.
Guard = Literal[
    "pool_above_range",  # the pool's utilisation is above its range
    "pool_below_range",  # the pool's utilisation is below its range
    "nodes_out_of_range",  # some up node of the pool is outside the node range
    "node_has_jobs",  # the step's node still runs jobs
]


class Step(Strict):
    """One typed step of a task's plan."""

    index: StepIndex
    name: Identifier
    action: StepAction
    guard: Guard | None = Field(
        default=None, description="Checked on fresh state just before the step runs."
    )
    timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 60.0
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    execution_count: ExecutionCount | None = Field(
        default=None, description="How many ops the step executes (nodes added or removed, "
        "jobs moved, 1 for a node action); None: computed when the step runs.",
    )


# Where a relation between two templates' tasks applies: anywhere in the cluster, on the same
# pool, or on the same target.
RelationScope = Literal["cluster", "pool", "target"]
OnFailure = Literal["fail", "proceed"]


class ExclusiveWith(Strict):
    """A template whose running tasks hold this task back (both ways) within `scope`."""

    template: Identifier
    scope: RelationScope = "cluster"


class Dependency(Strict):
    """A template whose tasks open when this one was queued must finish before it starts;
    `on_failure` says what this task does if one of them failed."""

    template: Identifier
    scope: RelationScope = "cluster"
    on_failure: OnFailure = "fail"


class TaskRelations(Strict):
    """How a task stands to other tasks, resolved from its template (names, not need kinds).

    The scheduler admits a task only while at most `concurrency` tasks of its template run in
    its cluster, no task it excludes runs, no task of another template runs on its pool unless
    either template is `concurrent_with` the other, and every task it depends on has finished.
    """

    template: Identifier = Field(description="The template's name (not its label).")
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 1
    exclusive_with: list[ExclusiveWith] = Field(default_factory=list, max_length=32)
    concurrent_with: list[Identifier] = Field(default_factory=list, max_length=32)
    depends_on: list[Dependency] = Field(default_factory=list, max_length=16)


class OpsTask(Envelope):
    """A task made from a need by a template: an ordered plan of steps."""

    event_type: Literal["ops_task"] = "ops_task"
    task_id: UUID
    parent_task_id: UUID | None = None
    need_id: UUID
    need_kind: NeedKind
    template: Identifier
    action_type: Identifier | None = Field(
        default=None,
        description="What the task does, for breakers, budgets and rate limits "
        "(e.g. migrate); None: the need kind.",
    )
    pool: Identifier = "default"
    target: Identifier
    breaker_scope: BreakerScope | None = Field(
        default=None, description="The scope of the task's breaker, from its template; None: "
        "the scheduler's setting for the kind.",
    )
    priority: Priority
    mutex_keys: list[Identifier] = Field(
        min_length=1, max_length=16, description="Locks held while the task runs."
    )
    dry_run: bool = False
    steps: list[Step] = Field(min_length=1, max_length=64)
    execution_count: ExecutionCount | None = Field(
        default=None, description="How many ops the task executes (its template's count: "
        "nodes taken offline, nodes added, jobs moved); None: computed at run time.",
    )
    relations: TaskRelations | None = Field(
        default=None, description="Its template's concurrency and relations; None (a child "
        "task, an older producer): only its locks hold it back.",
    )
    evidence: list[Evidence] = Field(default_factory=list, max_length=32)
    ranges: Ranges | None = Field(
        default=None, description="The ranges of the need, which the guards and plans check; "
        "None (an older producer): the defaults of `schemas.ranges`.",
    )

    @property
    def ranges_in_force(self) -> Ranges:
        """The ranges the executor checks for this task: its need's, else the defaults."""
        return self.ranges or DEFAULT_RANGES

    @property
    def kind(self) -> str:
        """The action type the task counts as (its breaker, budget and rate limit)."""
        return self.action_type or self.need_kind

    @model_validator(mode="after")
    def _steps_in_order(self) -> OpsTask:
        if [s.index for s in self.steps] != list(range(len(self.steps))):
            raise ValueError("steps must be indexed 0..n-1 in order")
        return self


class TaskScheduled(Envelope):
    """The scheduler handed a task to the executor under a fencing epoch."""

    event_type: Literal["task_scheduled"] = "task_scheduled"
    task: OpsTask
    epoch: Annotated[int, Field(ge=1, le=2**63 - 1)]


# ---------------------------------------------------------------- task lifecycle


class TaskEvent(Envelope):
    """Every transition of a task or one of its steps."""

    event_type: Literal["task_event"] = "task_event"
    task_id: UUID
    parent_task_id: UUID | None = None
    state: TaskState
    previous_state: TaskState | None = None
    step_index: StepIndex | None = None
    step_state: StepState | None = None
    command_id: UUID | None = None
    actor: Identifier
    reason: ShortText = ""
    outputs: dict[Identifier, OutputValue] = Field(default_factory=dict, max_length=32)
    task: OpsTask | None = Field(default=None, description="The full task, on `created` only.")


class TaskControl(Envelope):
    """An operator's intervention on a task.

    `restart` runs a failed or terminated task again from its first step, under a new epoch
    and run (new command ids, fresh attempts).
    """

    event_type: Literal["task_control"] = "task_control"
    task_id: UUID
    action: Literal["pause", "resume", "retry", "terminate", "jump", "restart"]
    step_index: StepIndex | None = None
    actor: Identifier
    reason: Reason

    @model_validator(mode="after")
    def _jump_needs_step(self) -> TaskControl:
        if (self.action == "jump") != (self.step_index is not None):
            raise ValueError("step_index is required for jump and only for jump")
        return self


AlertStatus = Literal["firing", "resolved"]


class Alert(Envelope):
    """Something a human should see (breaker open, short-circuit, needs-human).

    Alerts with the same `dedup_key` (in a cluster) are one alert: `firing` raises it or says
    it still holds, `resolved` says its cause ended (a breaker reset, a short-circuit over).
    The alerts service keeps each one's state and delivers it to Alertmanager.
    """

    event_type: Literal["alert"] = "alert"
    severity: Literal["info", "warning", "critical"]
    kind: Identifier
    dedup_key: Identifier
    message: ShortText
    status: AlertStatus = "firing"


TemplateOrigin = Literal["builtin", "manual", "tuned", "rollback"]


class TemplateChanged(Envelope):
    """A template's active version (or its pin) changed in the task store.

    Only a trigger: the templater reads the content from the store, so an event forged on the
    topic can make it reload, never run a template nobody saved. The subject is the template.
    """

    event_type: Literal["template_changed"] = "template_changed"
    template: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
    version: Annotated[int, Field(ge=1)]
    change: Literal["version", "pin", "unpin"] = "version"
    origin: TemplateOrigin | None = None
    actor: Identifier
    reason: ShortText = ""

"""Version 1 of every event of the loop, strict pydantic v2 models.

Bounds follow the validation rules of the project: at most 64 GPUs, 1,024 jobs and 16 peer
probes per report; strings at most 256 characters; utilisation 0-100; temperatures at most
150 C (beyond that a sensor is broken, and a broken sensor must never trigger remediation).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field, StringConstraints, model_validator

from schemas.envelope import Envelope, Identifier, Reason, ShortText, Strict

Percent = Annotated[float, Field(ge=0.0, le=100.0)]
MiB = Annotated[int, Field(ge=0, le=4_194_304)]
Count = Annotated[int, Field(ge=0, le=2**53)]
Seq = Annotated[int, Field(ge=0, le=2**63 - 1)]
Priority = Annotated[int, Field(ge=0, le=9, description="0 is the most urgent.")]
StepIndex = Annotated[int, Field(ge=0, le=63)]

GpuSource = Literal["nvml", "simulated"]
NodeMode = Literal["active", "draining", "offline"]
NodeStateName = Literal["up", "suspect", "down", "draining", "offline"]
FaultKind = Literal["xid", "ecc", "hung_job", "probe_failed", "heartbeat_missed", "agent"]
NeedKind = Literal["scale_out", "scale_in", "load_balance", "offline", "online"]
NeedLevel = Literal["gpu", "node", "cluster"]
# What a fault calls for, from the published XID playbooks (reset a GPU, reboot or replace
# the node, or just drain it); `none` is an event worth recording but not acting on.
ActionClass = Literal["none", "reset", "reboot", "replace", "drain"]
TaskState = Literal[
    "created", "queued", "dispatched", "running", "paused", "succeeded", "failed", "terminated"
]
StepState = Literal["scheduled", "started", "completed", "failed", "skipped"]
OutputValue = Annotated[str, Field(max_length=256)] | int | float | bool

# ---- ML task routing (issue 6): shared value types
ModelVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,32}$")]
Attempt = Annotated[int, Field(ge=1, le=16, description="1 for the first try of a task.")]
# A task's input: numbers only (the digits models take 64 pixel counts 0..16). Bounded so a
# signed command carrying it stays far below the agents' 16 KiB command limit.
MlInput = Annotated[list[Annotated[float, Field(ge=-1e6, le=1e6)]],
                    Field(min_length=1, max_length=1_024)]
# Why an ML attempt failed, in the words of the selector's attribution (policy/attribution.py):
# model_fault counts against the model, node_fault against the node, timeout and unknown
# against both; bad_input, capacity and deadline_too_short against neither. Two more never
# reach the statistics: unavailable (the model was not ready there, or the agent refused the
# command: the router's view was stale) and no_candidates (nothing served the task type).
InferenceCause = Literal["model_fault", "node_fault", "timeout", "unknown", "bad_input",
                         "capacity", "deadline_too_short", "unavailable", "no_candidates"]
MlTaskState = Literal["submitted", "running", "succeeded", "failed"]
ModelState = Literal["loading", "ready", "failed"]


# ---------------------------------------------------------------- node reports


class GpuMetrics(Strict):
    """One GPU as NVML (or the simulated device) sees it."""

    index: Annotated[int, Field(ge=0, le=63)]
    uuid: ShortText
    name: ShortText
    utilization_pct: Percent
    memory_used_mib: MiB
    memory_total_mib: MiB
    temperature_c: Annotated[float, Field(ge=-40.0, le=150.0)]
    power_w: Annotated[float, Field(ge=0.0, le=5_000.0)]
    ecc_corrected_volatile: Count | None = None
    ecc_uncorrected_volatile: Count | None = None
    ecc_corrected_aggregate: Count | None = None
    ecc_uncorrected_aggregate: Count | None = None
    xid_events: list[Annotated[int, Field(ge=0, le=65_535)]] = Field(
        default_factory=list, max_length=64, description="XIDs seen since the last report."
    )
    throttle_reasons: Count = 0

    @model_validator(mode="after")
    def _memory_fits(self) -> GpuMetrics:
        if self.memory_used_mib > self.memory_total_mib:
            raise ValueError("memory_used_mib exceeds memory_total_mib")
        return self


class HostMetrics(Strict):
    """Host metrics read through psutil."""

    cpu_pct: Percent
    memory_used_mib: MiB
    memory_total_mib: MiB
    disk_used_pct: Percent
    net_rx_bytes_per_s: Annotated[float, Field(ge=0.0, le=1e12)] = 0.0
    net_tx_bytes_per_s: Annotated[float, Field(ge=0.0, le=1e12)] = 0.0

    @model_validator(mode="after")
    def _memory_fits(self) -> HostMetrics:
        if self.memory_used_mib > self.memory_total_mib:
            raise ValueError("memory_used_mib exceeds memory_total_mib")
        return self


class Fault(Strict):
    """A piece of fault data: anything above the fault range (default 0) is a need."""

    kind: FaultKind
    code: Annotated[int, Field(ge=0, le=65_535)] | None = None
    gpu_index: Annotated[int, Field(ge=0, le=63)] | None = None
    detail: ShortText = ""


class JobInfo(Strict):
    """An ML job the agent runs."""

    job_id: Identifier
    kind: Literal["training", "inference"]
    state: Literal["starting", "running", "checkpointing", "stopped", "failed", "hung"]
    progress_pct: Percent = 0.0
    throughput: Annotated[float, Field(ge=0.0, le=1e9)] = 0.0
    gpu_indices: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        default_factory=list, max_length=64
    )


class PeerProbe(Strict):
    """The agent's probe of a peer node."""

    peer_node_id: Identifier
    reachable: bool
    rtt_ms: Annotated[float, Field(ge=0.0, le=600_000.0)] | None = None


class ServedModel(Strict):
    """A model the node serves for a task type: the router's registry is fed from these."""

    task_type: Identifier
    model: Identifier
    version: ModelVersion
    family: Identifier = Field(description="What kind of model (logreg, mlp, knn, ...).")
    state: ModelState = Field(description="Only a ready model is sent tasks.")
    max_concurrency: Annotated[int, Field(ge=1, le=1_024)] = Field(
        default=4, description="Tasks the node runs on this model at once; more are refused.")
    accuracy: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="Held-out accuracy measured when the model was loaded.")


class NodeReport(Envelope):
    """What an agent sends every interval: heartbeat, metrics, health, jobs and peer probes."""

    event_type: Literal["node_report"] = "node_report"
    node_id: Identifier
    pool: Identifier = "default"
    seq: Seq = Field(description="Per-node sequence; an older report is never used for decisions.")
    interval_s: Annotated[float, Field(gt=0.0, le=3_600.0)]
    gpu_source: GpuSource = Field(description="Where the GPU metrics came from.")
    mode: NodeMode = "active"
    gpus: list[GpuMetrics] = Field(default_factory=list, max_length=64)
    host: HostMetrics
    faults: list[Fault] = Field(default_factory=list, max_length=256)
    jobs: list[JobInfo] = Field(default_factory=list, max_length=1024)
    peer_probes: list[PeerProbe] = Field(default_factory=list, max_length=16)
    models: list[ServedModel] = Field(
        default_factory=list, max_length=64,
        description="The ML models the node serves (empty: none, or an agent that predates "
                    "model serving).")

    @model_validator(mode="after")
    def _subject_is_node(self) -> NodeReport:
        if self.subject != self.node_id:
            raise ValueError("subject must equal node_id")
        return self


# ---------------------------------------------------------------- collector output


class Sample(Envelope):
    """A validated report reduced to what analysis needs (one per accepted report)."""

    event_type: Literal["sample"] = "sample"
    node_id: Identifier
    pool: Identifier
    seq: Seq
    reported_at: AwareDatetime
    report_event_id: UUID
    mode: NodeMode
    gpu_count: Annotated[int, Field(ge=0, le=64)]
    gpu_utilization_pct: Percent
    gpu_memory_pct: Percent
    fault_count: Count
    faults: list[Fault] = Field(default_factory=list, max_length=256)
    gpu_source: GpuSource


class SampleBatch(Envelope):
    """The samples of one batch of reports from one reports partition, as one message.

    At 5,000 reports/s a message per sample would cost the broker and every consumer more
    than the samples are worth; batched, the analyzer evaluates hundreds per message. The
    subject is the reports partition the batch came from, so a node's samples stay in order.
    """

    event_type: Literal["sample_batch"] = "sample_batch"
    samples: list[Sample] = Field(min_length=1, max_length=2_000)


class NodeState(Envelope):
    """A node's state changed."""

    event_type: Literal["node_state"] = "node_state"
    node_id: Identifier
    pool: Identifier
    state: NodeStateName
    previous: NodeStateName | None = None
    reason: ShortText
    last_report_at: AwareDatetime | None = None


# ---------------------------------------------------------------- needs and tasks


class Evidence(Strict):
    """Why a need was raised: the measured value, the range it left, and where it came from."""

    metric: ShortText
    value: Annotated[float, Field(ge=-1e12, le=1e12)]
    range_low: Annotated[float, Field(ge=-1e12, le=1e12)]
    range_high: Annotated[float, Field(ge=-1e12, le=1e12)]
    observed_at: AwareDatetime
    source_event_id: UUID | None = None
    detail: ShortText = ""


class OpsNeed(Envelope):
    """An ops need raised by the analyzer; the templater turns it into a task."""

    event_type: Literal["ops_need"] = "ops_need"
    kind: NeedKind
    level: NeedLevel = "node"
    pool: Identifier = "default"
    target: Identifier = Field(description="The node (or cluster) the need is about.")
    evidence: list[Evidence] = Field(min_length=1, max_length=32)
    action_class: ActionClass | None = Field(
        default=None, description="For a fault: what it calls for (reset, reboot, replace)."
    )
    dry_run: bool = Field(default=False, description="Raised to be seen, not acted on.")


class PoolHealth(Envelope):
    """A pool's health and utilisation, published every analysis period.

    The scheduler's short-circuit reads `unhealthy_fraction`: above 40% no automatic
    offline, drain or migrate; at 100% no action at all (more likely a monitoring fault).
    """

    event_type: Literal["pool_health"] = "pool_health"
    pool: Identifier
    nodes_total: Count
    nodes_by_state: dict[NodeStateName, Count]
    unhealthy_fraction: Annotated[float, Field(ge=0.0, le=1.0)]
    gpu_utilization_pct: Percent
    demand_pct: Annotated[float, Field(ge=0.0, le=1e6)] = Field(
        default=0.0, description="Queued GPU demand as a share of the pool's capacity."
    )
    effective_utilization_pct: Annotated[float, Field(ge=0.0, le=1e6)]


class DrainNode(Strict):
    """Stop accepting new work on a node."""

    action: Literal["drain_node"] = "drain_node"
    node_id: Identifier


class UndrainNode(Strict):
    """Accept new work again."""

    action: Literal["undrain_node"] = "undrain_node"
    node_id: Identifier


class OfflineNode(Strict):
    """Take a drained node out of service."""

    action: Literal["offline_node"] = "offline_node"
    node_id: Identifier


class OnlineNode(Strict):
    """Return a repaired node to service."""

    action: Literal["online_node"] = "online_node"
    node_id: Identifier


class MigrateJob(Strict):
    """Move a job out of its node: checkpoint it (acknowledged within `checkpoint_timeout_s`),
    stop it, and publish the checkpoint to the shared store; `start_job` brings it back up
    on `to_node_id`."""

    action: Literal["migrate_job"] = "migrate_job"
    node_id: Identifier
    job_id: Identifier
    to_node_id: Identifier | None = None
    checkpoint_timeout_s: Annotated[float, Field(gt=0.0, le=3_600.0)] = 20.0


class StartJob(Strict):
    """Start a job, optionally from a checkpoint."""

    action: Literal["start_job"] = "start_job"
    node_id: Identifier
    job_id: Identifier
    kind: Literal["training", "inference"] = "training"
    checkpoint: Identifier | None = Field(
        default=None, description="A checkpoint in the shared store to resume from."
    )


class StopJob(Strict):
    """Stop a job."""

    action: Literal["stop_job"] = "stop_job"
    node_id: Identifier
    job_id: Identifier


class SetResources(Strict):
    """Change a job's resources."""

    action: Literal["set_resources"] = "set_resources"
    node_id: Identifier
    job_id: Identifier
    gpus: Annotated[int, Field(ge=0, le=64)]
    memory_mib: MiB


class SetReportInterval(Strict):
    """Change how often the agent reports (shorter by day, longer at night)."""

    action: Literal["set_report_interval"] = "set_report_interval"
    node_id: Identifier
    interval_s: Annotated[float, Field(ge=0.5, le=3_600.0)]


class ProbeNode(Strict):
    """The centre's probe: answer at once, proving the command path works end to end."""

    action: Literal["probe_node"] = "probe_node"
    node_id: Identifier


class QueryStatus(Strict):
    """Ask the agent what became of an earlier command."""

    action: Literal["query_status"] = "query_status"
    node_id: Identifier
    command_id: UUID


class Cancel(Strict):
    """Cancel a running command."""

    action: Literal["cancel"] = "cancel"
    node_id: Identifier
    command_id: UUID


class RunInference(Strict):
    """Run one ML task on a model the node serves: which model, which version, which input.

    Sent by the router, outside the node's command ordering (it disrupts nothing and is
    idempotent by command id); the answer is a CommandResult whose `inference` says how it
    went.
    """

    action: Literal["run_inference"] = "run_inference"
    node_id: Identifier
    task_id: UUID
    attempt: Attempt
    task_type: Identifier
    model: Identifier
    version: ModelVersion
    input: MlInput
    timeout_s: Annotated[float, Field(gt=0.0, le=3_600.0)] = Field(
        default=5.0, description="The node gives up (cause timeout) after this long.")


AgentAction = (
    DrainNode
    | UndrainNode
    | OfflineNode
    | OnlineNode
    | MigrateJob
    | StartJob
    | StopJob
    | SetResources
    | SetReportInterval
    | ProbeNode
    | QueryStatus
    | Cancel
)
# The allow-list of what the centre may ask an agent to do; anything else is rejected by the
# discriminator before any handler runs. Template steps may use the ops actions only
# (AgentAction); run_inference comes from the router.
NodeAction = AgentAction | RunInference
Action = Annotated[NodeAction, Field(discriminator="action")]
OpsActionName = Literal[
    "drain_node",
    "undrain_node",
    "offline_node",
    "online_node",
    "migrate_job",
    "start_job",
    "stop_job",
    "set_resources",
    "set_report_interval",
    "probe_node",
    "query_status",
    "cancel",
]
ActionName = OpsActionName | Literal["run_inference"]


# ---------------------------------------------------------------- centre actions
#
# Steps an agent cannot carry out alone: the executor carries them out itself, through the
# capacity provider or by splitting the step into child tasks. They are never sent to a node.


class AddCapacity(Strict):
    """Add nodes to a pool from the capacity provider.

    `nodes` 0 lets the step compute the count just before it runs, from measured capacity:
    enough to bring the pool back to the middle of its range.
    """

    action: Literal["add_capacity"] = "add_capacity"
    pool: Identifier
    nodes: Annotated[int, Field(ge=0, le=64)] = 0


class RemoveCapacity(Strict):
    """Remove nodes from a pool: one child task per node (drain, migrate its jobs, release).

    `nodes` 0 lets the step compute the count from measured capacity.
    """

    action: Literal["remove_capacity"] = "remove_capacity"
    pool: Identifier
    nodes: Annotated[int, Field(ge=0, le=64)] = 0


class MigrateJobs(Strict):
    """Move jobs: one child task per job (migrate_job out of its node, start_job elsewhere).

    With `node_id` every job of that node moves; without, jobs move from the most loaded
    nodes of the pool to the least loaded (a rebalance), at most `max_jobs` of them.
    """

    action: Literal["migrate_jobs"] = "migrate_jobs"
    pool: Identifier
    node_id: Identifier | None = None
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 8


class ReleaseNode(Strict):
    """Hand a drained, emptied node back to the capacity provider (which stops it)."""

    action: Literal["release_node"] = "release_node"
    node_id: Identifier


CENTRE_ACTIONS: frozenset[str] = frozenset(
    {"add_capacity", "remove_capacity", "migrate_jobs", "release_node"}
)

# What a step may do: an agent command, or a centre action.
StepAction = Annotated[
    AgentAction | AddCapacity | RemoveCapacity | MigrateJobs | ReleaseNode,
    Field(discriminator="action"),
]
StepActionName = OpsActionName | Literal[
    "add_capacity", "remove_capacity", "migrate_jobs", "release_node"
]

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
    priority: Priority
    mutex_keys: list[Identifier] = Field(
        min_length=1, max_length=16, description="Locks held while the task runs."
    )
    dry_run: bool = False
    steps: list[Step] = Field(min_length=1, max_length=64)
    evidence: list[Evidence] = Field(default_factory=list, max_length=32)

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


# ---------------------------------------------------------------- commands


class CommandPayload(Strict):
    """What an agent executes; signed by the centre and verified by the agent before acting."""

    command_id: UUID
    node_id: Identifier
    seq: Seq
    epoch: Annotated[int, Field(ge=1, le=2**63 - 1)]
    issued_at: AwareDatetime
    expires_at: AwareDatetime
    task_id: UUID | None = None
    step_index: StepIndex | None = None
    dry_run: bool = False
    action: Action

    @model_validator(mode="after")
    def _action_for_this_node(self) -> CommandPayload:
        if self.action.node_id != self.node_id:
            raise ValueError("action.node_id must equal node_id")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self


class Command(Envelope):
    """A signed command. `payload` is the exact signed bytes (base64url of canonical JSON)."""

    event_type: Literal["command"] = "command"
    kid: Identifier
    alg: Literal["ed25519"] = "ed25519"
    payload: Annotated[str, Field(min_length=1, max_length=16_384, pattern=r"^[A-Za-z0-9_-]+$")]
    sig: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")]


class InferenceOutput(Strict):
    """What running one ML task on a node gave: the answer, or the cause of the failure."""

    task_id: UUID
    attempt: Attempt
    task_type: Identifier
    model: Identifier
    version: ModelVersion
    family: Identifier | None = None
    cause: InferenceCause | None = Field(default=None, description="None when it succeeded.")
    latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] = Field(
        description="Time spent on the node, from the command's arrival to its answer.")
    prediction: Annotated[int, Field(ge=-(2**31), le=2**31)] | None = None
    confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    detail: ShortText = ""


class CommandResult(Envelope):
    """An agent's answer to a command (or its cached answer to a duplicate)."""

    event_type: Literal["command_result"] = "command_result"
    command_id: UUID
    node_id: Identifier
    task_id: UUID | None = None
    step_index: StepIndex | None = None
    action: ActionName | None = None
    outcome: Literal["succeeded", "failed", "rejected", "unknown"]
    reason: ShortText = ""
    duplicate: bool = False
    outputs: dict[Identifier, OutputValue] = Field(default_factory=dict, max_length=32)
    inference: InferenceOutput | None = Field(
        default=None, description="run_inference only: the task's answer or failure cause.")


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
    """An operator's intervention on a task."""

    event_type: Literal["task_control"] = "task_control"
    task_id: UUID
    action: Literal["pause", "resume", "retry", "terminate", "jump"]
    step_index: StepIndex | None = None
    actor: Identifier
    reason: Reason

    @model_validator(mode="after")
    def _jump_needs_step(self) -> TaskControl:
        if (self.action == "jump") != (self.step_index is not None):
            raise ValueError("step_index is required for jump and only for jump")
        return self


class Alert(Envelope):
    """Something a human should see (breaker open, short-circuit, needs-human)."""

    event_type: Literal["alert"] = "alert"
    severity: Literal["info", "warning", "critical"]
    kind: Identifier
    dedup_key: Identifier
    message: ShortText


# ---------------------------------------------------------------- ML task routing


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
    (`policy.selector.replay`). `saturated` and `no_candidates` decisions choose nothing:
    the task waits and is selected again.
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


EVENT_MODELS: dict[str, type[Envelope]] = {
    "node_report": NodeReport,
    "sample": Sample,
    "sample_batch": SampleBatch,
    "node_state": NodeState,
    "ops_need": OpsNeed,
    "ops_task": OpsTask,
    "task_scheduled": TaskScheduled,
    "command": Command,
    "command_result": CommandResult,
    "task_event": TaskEvent,
    "task_control": TaskControl,
    "alert": Alert,
    "pool_health": PoolHealth,
    "ml_task_submitted": MlTaskSubmitted,
    "ml_task_outcome": MlTaskOutcome,
    "model_selected": ModelSelected,
}


def now_utc() -> datetime:
    """The current time, aware, in UTC (for adapters; policy code takes `now` as an argument)."""
    from datetime import UTC

    return datetime.now(UTC)

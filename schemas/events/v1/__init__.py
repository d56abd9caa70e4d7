"""Version 1 of every event of the loop, strict pydantic v2 models, one module per family.

- `values`: value types more than one family uses (bounds, node modes, ML inputs);
- `reports`: what an agent reports every interval;
- `analysis`: samples, node states, needs, pool health and capacity plans derived from the
  reports;
- `actions`: what a step may do, on a node (the agent) or in the centre (the executor);
- `tasks`: ops tasks, their steps and lifecycle, operators' control and alerts;
- `commands`: signed commands to an agent and its answers;
- `ml`: ML task routing (submissions, selection decisions, outcomes).

Import from here (`from schemas.events.v1 import NodeReport`): the modules are the layout,
this package is the contract.

Bounds follow the validation rules of the project: at most 64 GPUs, 1,024 jobs and 16 peer
probes per report; strings at most 256 characters; utilisation 0-100; temperatures at most
150 C (beyond that a sensor is broken, and a broken sensor must never trigger remediation).
"""

from __future__ import annotations

from datetime import datetime

from schemas.envelope import Envelope
from schemas.events.v1.actions import (
    CENTRE_ACTIONS,
    Action,
    ActionName,
    AddCapacity,
    AgentAction,
    Cancel,
    DrainNode,
    MigrateJob,
    MigrateJobs,
    NodeAction,
    OfflineNode,
    OnlineNode,
    OpsActionName,
    ProbeNode,
    QueryStatus,
    ReleaseNode,
    RemoveCapacity,
    RunInference,
    SetReportInterval,
    SetResources,
    StartJob,
    StepAction,
    StepActionName,
    StopJob,
    UndrainNode,
)
from schemas.events.v1.analysis import (
    ActionClass,
    CapacityPlan,
    Evidence,
    NeedLevel,
    NodeState,
    NodeStateName,
    OpsNeed,
    PlanBasis,
    PlanDay,
    PoolHealth,
    PoolPlan,
    ProcurementStep,
    Sample,
    SampleBatch,
    state_from_mode,
)
from schemas.events.v1.commands import Command, CommandPayload, CommandResult, InferenceOutput
from schemas.events.v1.ml import (
    ArmKey,
    CandidateVerdict,
    ConfigValue,
    Finite,
    MlTaskOutcome,
    MlTaskState,
    MlTaskSubmitted,
    ModelSelected,
    PolicyModel,
    SelectionAvoid,
    SelectionCandidate,
    SelectionInputs,
    SelectionStatus,
    SelectionTask,
    StatField,
)
from schemas.events.v1.reports import (
    MOVABLE_JOB_STATES,
    Fault,
    FaultKind,
    GpuMetrics,
    GpuSource,
    HostMetrics,
    JobInfo,
    ModelState,
    NodeReport,
    PeerProbe,
    ServedModel,
)
from schemas.events.v1.tasks import (
    Alert,
    AlertStatus,
    BreakerScope,
    Guard,
    OpsTask,
    Step,
    StepState,
    TaskControl,
    TaskEvent,
    TaskScheduled,
    TaskState,
)
from schemas.events.v1.values import (
    Attempt,
    Count,
    InferenceCause,
    MiB,
    MlInput,
    ModelVersion,
    NeedKind,
    NodeMode,
    OutputValue,
    Percent,
    Priority,
    Seq,
    StepIndex,
)

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
    "capacity_plan": CapacityPlan,
    "ml_task_submitted": MlTaskSubmitted,
    "ml_task_outcome": MlTaskOutcome,
    "model_selected": ModelSelected,
}


def now_utc() -> datetime:
    """The current time, aware, in UTC (for adapters; policy code takes `now` as an argument)."""
    from datetime import UTC

    return datetime.now(UTC)


__all__ = [
    "CENTRE_ACTIONS",
    "EVENT_MODELS",
    "MOVABLE_JOB_STATES",
    "Action",
    "ActionClass",
    "ActionName",
    "AddCapacity",
    "AgentAction",
    "Alert",
    "AlertStatus",
    "ArmKey",
    "Attempt",
    "BreakerScope",
    "Cancel",
    "CandidateVerdict",
    "CapacityPlan",
    "Command",
    "CommandPayload",
    "CommandResult",
    "ConfigValue",
    "Count",
    "DrainNode",
    "Evidence",
    "Fault",
    "FaultKind",
    "Finite",
    "GpuMetrics",
    "GpuSource",
    "Guard",
    "HostMetrics",
    "InferenceCause",
    "InferenceOutput",
    "JobInfo",
    "MiB",
    "MigrateJob",
    "MigrateJobs",
    "MlInput",
    "MlTaskOutcome",
    "MlTaskState",
    "MlTaskSubmitted",
    "ModelSelected",
    "ModelState",
    "ModelVersion",
    "NeedKind",
    "NeedLevel",
    "NodeAction",
    "NodeMode",
    "NodeReport",
    "NodeState",
    "NodeStateName",
    "OfflineNode",
    "OnlineNode",
    "OpsActionName",
    "OpsNeed",
    "OpsTask",
    "OutputValue",
    "PeerProbe",
    "Percent",
    "PlanBasis",
    "PlanDay",
    "PolicyModel",
    "PoolHealth",
    "PoolPlan",
    "Priority",
    "ProbeNode",
    "ProcurementStep",
    "QueryStatus",
    "ReleaseNode",
    "RemoveCapacity",
    "RunInference",
    "Sample",
    "SampleBatch",
    "SelectionAvoid",
    "SelectionCandidate",
    "SelectionInputs",
    "SelectionStatus",
    "SelectionTask",
    "Seq",
    "ServedModel",
    "SetReportInterval",
    "SetResources",
    "StartJob",
    "StatField",
    "Step",
    "StepAction",
    "StepActionName",
    "StepIndex",
    "StepState",
    "StopJob",
    "TaskControl",
    "TaskEvent",
    "TaskScheduled",
    "TaskState",
    "UndrainNode",
    "now_utc",
    "state_from_mode",
]

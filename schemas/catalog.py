"""Which event model travels on which topic: the one map every consumer validates against."""

from schemas.envelope import Envelope
from schemas.events.v1 import (
    Alert,
    CapacityPlan,
    Command,
    CommandResult,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    NodeReport,
    NodeState,
    OpsNeed,
    OpsTask,
    PoolHealth,
    SampleBatch,
    TaskControl,
    TaskEvent,
    TaskScheduled,
    TemplateChanged,
)
from schemas.topics import Topic

TOPIC_MODELS: dict[Topic, type[Envelope]] = {
    Topic.NODE_REPORTS: NodeReport,
    Topic.NODE_COMMANDS: Command,
    Topic.NODE_COMMAND_RESULTS: CommandResult,
    Topic.OPS_SAMPLES: SampleBatch,
    Topic.OPS_NODE_STATE: NodeState,
    Topic.OPS_NEEDS: OpsNeed,
    Topic.OPS_TASKS: OpsTask,
    Topic.OPS_TASKS_SCHEDULED: TaskScheduled,
    Topic.OPS_TASK_EVENTS: TaskEvent,
    Topic.OPS_TASK_CONTROL: TaskControl,
    Topic.OPS_ALERTS: Alert,
    Topic.OPS_POOL_HEALTH: PoolHealth,
    Topic.OPS_CAPACITY_PLANS: CapacityPlan,
    Topic.OPS_TEMPLATE_CHANGES: TemplateChanged,
    Topic.ML_TASKS_SUBMITTED: MlTaskSubmitted,
    Topic.ML_TASKS_OUTCOMES: MlTaskOutcome,
    Topic.ML_DECISIONS: ModelSelected,
}

"""Every topic name, defined once and versioned.

A breaking change to an event makes a `v2` model and a `.v2` topic; adding an optional field
stays in `v1` and raises the topic's `schema_minor` (docs/events.md: what else a version
allows, and how a reader takes a newer minor). A namespace (one per test run, or per
deployment sharing a broker) prefixes every name so that runs never see each other's events.
"""

from enum import StrEnum


class Topic(StrEnum):
    """Base topic names; use `topic_name` to get the name on the wire."""

    NODE_REPORTS = "node.reports.v1"
    NODE_COMMANDS = "node.commands.v1"
    NODE_COMMAND_RESULTS = "node.command-results.v1"
    OPS_SAMPLES = "ops.samples.v1"
    OPS_NODE_STATE = "ops.node-state.v1"
    OPS_POOL_HEALTH = "ops.pool-health.v1"
    OPS_NEEDS = "ops.needs.v1"
    OPS_TASKS = "ops.tasks.v1"
    OPS_TASKS_SCHEDULED = "ops.tasks.scheduled.v1"
    OPS_TASK_EVENTS = "ops.task-events.v1"
    OPS_TASK_CONTROL = "ops.task-control.v1"
    OPS_ALERTS = "ops.alerts.v1"
    OPS_CAPACITY_PLANS = "ops.capacity-plans.v1"
    OPS_TEMPLATE_CHANGES = "ops.template-changes.v1"
    ML_TASKS_SUBMITTED = "ml.tasks.submitted.v1"
    ML_TASKS_OUTCOMES = "ml.tasks.outcomes.v1"
    ML_DECISIONS = "ml.tasks.decisions.v1"


DEAD_LETTER_SUFFIX = ".dlt"

# Node reports carry the fleet's volume (5,000/s at 50,000 nodes), so they get the most
# partitions; everything else is low volume and keyed by task or node id.
PARTITIONS: dict[Topic, int] = {topic: 3 for topic in Topic} | {
    Topic.NODE_REPORTS: 6,
    Topic.OPS_SAMPLES: 6,
}


def topic_name(topic: Topic, namespace: str = "") -> str:
    """The wire name of `topic` inside `namespace` (empty: the production names)."""
    return f"{namespace}.{topic.value}" if namespace else topic.value


def dead_letter_name(wire_name: str) -> str:
    """The dead-letter topic of a consumed topic."""
    return wire_name + DEAD_LETTER_SUFFIX

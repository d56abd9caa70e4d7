"""What the collector and the analyzer derive from reports: samples, node states, needs, pool
health."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from schemas.envelope import Envelope, Identifier, ShortText, Strict
from schemas.events.v1.reports import Fault, GpuSource
from schemas.events.v1.values import Count, NeedKind, NodeMode, Percent, Seq
from schemas.ranges import Ranges

NodeStateName = Literal["up", "suspect", "down", "draining", "offline"]
NeedLevel = Literal["gpu", "node", "cluster"]
# What a fault calls for, from the published XID playbooks (reset a GPU, reboot or replace
# the node, or just drain it); `none` is an event worth recording but not acting on.
ActionClass = Literal["none", "reset", "reboot", "replace", "drain"]

_STATE_OF_MODE: Mapping[NodeMode, NodeStateName] = MappingProxyType({
    "active": "up", "draining": "draining", "offline": "offline",
})


def state_from_mode(mode: NodeMode) -> NodeStateName:
    """The node state a report (or its sample) implies: a reporting node is up unless it
    drained itself or went offline."""
    return _STATE_OF_MODE[mode]


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
    movable_jobs: Count = Field(
        default=0, description="Jobs that moving to another node could help with "
        "(`JobInfo.movable`).")
    pinned_jobs: Count = Field(
        default=0, description="Running jobs that cannot move: gang, whole-node or "
        "do-not-disrupt.")
    cpu_pct: Percent = Field(default=0.0, description="Host CPU in use.")
    memory_pct: Percent = Field(default=0.0, description="Host memory in use.")
    disk_used_pct: Percent = Field(default=0.0, description="Storage in use (the load weighed "
                                   "by ANALYZER_STORAGE_WEIGHT).")
    net_bytes_per_s: Annotated[float, Field(ge=0.0, le=2e12)] = Field(
        default=0.0, description="Host network traffic, received plus sent.")


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


# ---------------------------------------------------------------- needs


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
    ranges: Ranges | None = Field(
        default=None, description="The pool and node ranges the need was raised under; "
        "None (an older analyzer): the defaults of `schemas.ranges`.",
    )


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

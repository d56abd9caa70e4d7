"""What the collector and the analyzer derive from reports: samples, node states, needs, pool
health, and the pools' capacity plans."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from schemas.envelope import Envelope, Identifier, Reason, ShortText, Strict
from schemas.events.v1.reports import Fault, GpuSource
from schemas.events.v1.values import Count, NeedKind, NodeMode, Percent, Seq
from schemas.ranges import Band, Ranges

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
    job_throughput: Annotated[float, Field(ge=0.0, le=1e12)] = Field(
        default=0.0, description="Work the node delivers: the throughput of its running jobs "
        "(`JobInfo.throughput`), summed.")
    node_type: ShortText = Field(
        default="unknown", description="What kind of node: its GPUs' model name "
        "(`GpuMetrics.name`), or unknown.")


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
    agent_dead: bool = Field(
        default=False, description="The node stopped reporting but its peers still reach it: "
        "its agent is dead, not the node (the state stays suspect, never down).")


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


# ---------------------------------------------------------------- capacity planning

PlanBasis = Literal["mean", "upper_80"]
PlanPct = Annotated[float, Field(ge=0.0, le=1e6)]


class PlanDay(Strict):
    """One day of a capacity plan: the forecast daily peak utilisation (% of the pool's
    capacity today) with its 80 % and 95 % intervals, and the nodes that keep it within the
    range (at or below `high_exit`) on the mean and on the 80 % upper bound."""

    day: AwareDatetime = Field(description="Midnight UTC starting the day.")
    peak_pct: PlanPct
    lower_80: PlanPct
    upper_80: PlanPct
    lower_95: PlanPct
    upper_95: PlanPct
    nodes_mean: Count
    nodes_upper_80: Count


class ProcurementStep(Strict):
    """Nodes of one type to have in the pool by `needed_by`, ordered by `order_by` (the
    procurement lead time before); a step adds to the pool as it is plus the earlier steps."""

    needed_by: AwareDatetime
    order_by: AwareDatetime
    node_type: Identifier
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    nodes: Annotated[int, Field(ge=1, le=100_000)]
    gpus: Annotated[int, Field(ge=1, le=6_400_000)]
    basis: PlanBasis
    late: bool = Field(default=False, description="order_by was already past when planned.")
    reason: Reason


class PoolPlan(Strict):
    """A pool's capacity plan, weeks to months ahead (services/forecast/planning.py)."""

    generated_at: AwareDatetime
    horizon_days: Annotated[int, Field(ge=1, le=1_096)]
    model: ShortText
    history_days: Count
    history_from: AwareDatetime | None = None
    peak_uplift_pct: PlanPct = Field(
        description="The typical daily peak hour above the daily mean, from hourly history.")
    band: Band
    nodes_now: Count
    gpus_now: Count
    node_type: Identifier
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    lead_time_days: Annotated[int, Field(ge=0, le=730)]
    leaves_range_at: AwareDatetime | None = Field(
        default=None, description="First day the peak (mean) is above high_enter.")
    leaves_range_at_upper_80: AwareDatetime | None = Field(
        default=None, description="First day the peak's 80 % upper bound is above high_enter.")
    below_range_at: AwareDatetime | None = Field(
        default=None, description="First day the peak's 80 % upper bound is below low_enter "
                                  "(more capacity than the pool needs; never a removal).")
    days: list[PlanDay] = Field(default_factory=list, max_length=1_096)
    procurement: list[ProcurementStep] = Field(default_factory=list, max_length=32)
    notes: list[ShortText] = Field(default_factory=list, max_length=16)


class CapacityPlan(Envelope):
    """A pool's periodic capacity plan for procurement, published for other teams.

    The subject is the pool. Advice only: nothing in ClusterWarden acts on a plan."""

    event_type: Literal["capacity_plan"] = "capacity_plan"
    pool: Identifier
    plan: PoolPlan
